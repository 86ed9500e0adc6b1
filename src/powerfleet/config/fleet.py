"""FleetConfig: the single config object every powerfleet process is built from.

Sources, later wins: built-in defaults < YAML file (``--config`` or ``POWERFLEET_CONFIG``) <
``POWERFLEET_*`` environment variables. Nested keys use a double underscore in the variable
name: ``POWERFLEET_BEAT__RECONCILE_INTERVAL_S=5`` sets ``beat.reconcile_interval_s``. Values
from the environment are parsed as YAML scalars/flow collections, so ``[a, b]`` is a list.

Every validation failure becomes one ConfigError naming the source and the dotted key.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator

from powerfleet.config.broker_urls import check_broker_url, is_sentinel

ENV_PREFIX = "POWERFLEET_"
ENV_CONFIG_FILE = "POWERFLEET_CONFIG"
# Kubernetes node names are DNS subdomains; queue names are built from them.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label


def is_node_name(name: str) -> bool:
    # fullmatch: "$" alone also matches before a trailing newline ("gpu-1\n" would pass).
    return _NODE_NAME.fullmatch(name) is not None


class ConfigError(Exception):
    """A config problem, already phrased as one line for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SentinelConfig(_Strict):
    # The name the Sentinels monitor (`sentinel monitor <name> ...`); required with sentinel:// URLs.
    master_name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    # The Sentinels' own password (their `requirepass`); the Redis master's goes in the URL.
    password: str | None = None
    # TLS to the Sentinels and to the Redis nodes they name, verified against this CA file
    # (the system store when unset).
    tls: bool = False
    tls_ca_file: str | None = None


class BrokerConfig(_Strict):
    # None: start a private redis-server on loopback (see powerfleet.broker.embedded).
    # redis://, rediss://, unix://, or sentinel://host:port URLs joined by ; (docs/reliability.md).
    url: str | None = None
    result_backend: str | None = None  # defaults to the broker URL
    sentinel: SentinelConfig = SentinelConfig()
    # A publish the master refuses with NOREPLICAS (min-replicas-to-write unmet, e.g. while a
    # replica resyncs after a failover) is retried for this long, then reported in one line.
    noreplicas_retry_s: float = Field(5.0, ge=0, le=120)
    # Must exceed the longest acks_late task, or Redis redelivers it while it still runs.
    visibility_timeout_s: int = Field(3600, ge=60, le=7 * 86400)
    # Every tick stores a small result: a day of them at the default rates is ~36 MB of Redis
    # (docs/reliability.md measured ~1.5 MB per hour); a week would be ~250 MB.
    result_expires_s: int = Field(86400, ge=3600)

    @field_validator("url", "result_backend")
    @classmethod
    def _redis_scheme(cls, v: str | None) -> str | None:
        return None if v is None else check_broker_url(v)

    @model_validator(mode="after")
    def _sentinel_needs_a_master(self) -> "BrokerConfig":
        if (is_sentinel(self.url) or is_sentinel(self.result_backend)) and self.sentinel.master_name is None:
            raise ValueError("a sentinel:// URL needs broker.sentinel.master_name (the name the Sentinels monitor)")
        return self


class BeatConfig(_Strict):
    reconcile_interval_s: float = Field(15.0, gt=0, le=86400)
    budget_interval_s: float = Field(30.0, gt=0, le=86400)
    retune_interval_s: float = Field(10.0, gt=0, le=86400)
    # The RedBeat lock: a standby beat takes over at most this long after the leader dies.
    lock_timeout_s: int = Field(60, ge=5, le=3600)
    max_loop_interval_s: int = Field(5, ge=1, le=300)

    @model_validator(mode="after")
    def _lock_outlives_loop(self) -> "BeatConfig":
        if self.lock_timeout_s <= self.max_loop_interval_s:
            raise ValueError("lock_timeout_s must be greater than max_loop_interval_s")
        return self


class TimeLimit(_Strict):
    soft_s: float = Field(gt=0)
    hard_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _soft_below_hard(self) -> "TimeLimit":
        if self.soft_s >= self.hard_s:
            raise ValueError("soft_s must be less than hard_s")
        return self


class TimeLimits(_Strict):
    """Soft/hard limits per task family; prefork workers enforce both."""

    control: TimeLimit = TimeLimit(soft_s=60, hard_s=90)
    sweep: TimeLimit = TimeLimit(soft_s=600, hard_s=660)
    node: TimeLimit = TimeLimit(soft_s=20, hard_s=30)


class FlowerConfig(_Strict):
    address: str = "127.0.0.1"
    port: int = Field(5555, ge=1, le=65535)
    # "user:password" entries. Required when address is not loopback.
    basic_auth: list[str] = Field(default_factory=list)
    # Flower's worker-control endpoints (shutdown, pool, consumers, rate/time limits, revoke,
    # abort) stop work or uncap a node with one call; off, they answer 403 (docs/operations.md).
    allow_worker_control: bool = False

    @field_validator("basic_auth")
    @classmethod
    def _user_colon_password(cls, v: list[str]) -> list[str]:
        for entry in v:
            user, sep, password = entry.partition(":")
            if not sep or not user or not password:
                raise ValueError("each entry must be 'user:password'")
        return v

    @property
    def is_loopback(self) -> bool:
        if self.address == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            return False


class TaskApiConfig(_Strict):
    """Sends by hand (`powerfleet trigger`, Flower's task API)."""

    # The JSON arguments of one send; the result (often an echo of them) stays in Redis for
    # broker.result_expires_s, so an unbounded payload is unbounded Redis memory.
    max_payload_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024)


class MetricsConfig(_Strict):
    port: int = Field(0, ge=0, le=65535)  # 0 disables /metrics
    address: str = "127.0.0.1"


RETUNE_OBJECTIVES = ("throughput", "throughputPerGpu", "throughputPerUser", "ttft", "e2eLatency", "goodput",
                     "goodputPerGpu")


class RetuneDeploymentConfig(_Strict):
    """Per-deployment overrides of the retune defaults (docs/retune.md); None inherits."""

    enabled: bool | None = None
    mode: Literal["active", "advisory"] | None = None
    namespace: str | None = None
    window_interval_s: int | None = Field(None, ge=10, le=86400)
    window_phase_s: int | None = Field(None, ge=0)
    grid: dict[str, Any] | None = None  # checked by powerfleet.retune.settings (an invalid grid stops retune)
    objective: Literal[RETUNE_OBJECTIVES] | None = None  # type: ignore[valid-type]
    sla: dict[str, float] | None = None
    min_improvement_percentage: float | None = Field(None, ge=0, allow_inf_nan=False)
    min_requests: int | None = Field(None, ge=0, le=10_000_000)
    confidence: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False)
    dwell_windows: int | None = Field(None, ge=0, le=10_000)
    search_rounds: int | None = Field(None, ge=0, le=50)
    shift_z: float | None = Field(None, ge=0, le=1000, allow_inf_nan=False)
    shift_min_ratio: float | None = Field(None, gt=1, le=100, allow_inf_nan=False)
    engine_profile: str | None = None  # fleet config only (the DGD annotation may not name a file)
    prefill_engine_profile: str | None = None  # fleet config only, like engine_profile
    kv_transfer_gb_s: float | None = Field(None, gt=0, le=100_000, allow_inf_nan=False)
    max_shards: int | None = Field(None, ge=1, le=256)
    time_budget_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    shard_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    trace_dir: str | None = None


class RetuneConfig(_Strict):
    window_interval_s: int = Field(300, ge=10, le=86400)
    window_phase_s: int = Field(0, ge=0)
    # Deployments with retune enabled (the cluster layer adds the DGD-driven list later).
    deployments: list[str] = Field(default_factory=list)
    # Defaults for every deployment; `per_deployment.<dgd>` overrides them (and can disable one).
    mode: Literal["active", "advisory"] = "active"
    namespace: str = "default"  # the DGDs' namespace and the fleet's own (the Leases live here)
    kubeconfig: str | None = None  # None: in-cluster service account
    grid: dict[str, Any] | None = None  # None: the default 108-point grid
    objective: Literal[RETUNE_OBJECTIVES] = "ttft"  # type: ignore[valid-type]
    sla: dict[str, float] | None = None
    min_improvement_percentage: float = Field(1.0, ge=0, allow_inf_nan=False)
    # The noise guard (docs/retune.md): a window decides only with this many requests; the
    # best must beat the probe on paired batches with this one-sided confidence (0: off); a
    # parameter that moved may not move back within this many windows.
    min_requests: int = Field(200, ge=0, le=10_000_000)
    confidence: float = Field(0.95, ge=0, lt=1, allow_inf_nan=False)
    dwell_windows: int = Field(3, ge=0, le=10_000)
    # Rounds of the search beyond the grid's edge (one fan-out each in the live loop; 0: off).
    search_rounds: int = Field(6, ge=0, le=50)
    # A load change inside the window (retune/shift.py): when the request or prompt-token rate
    # steps by at least shift_min_ratio (up or down) with Welch's t >= shift_z on 10 s bins,
    # the window is scored from the change on (the traffic before it only warms up); 0: off.
    shift_z: float = Field(5.0, ge=0, le=1000, allow_inf_nan=False)
    shift_min_ratio: float = Field(1.25, gt=1, le=100, allow_inf_nan=False)
    # The engine profile the sweeps replay (a measured table, `sim replay --profile`); None:
    # the built-in Llama-3-70B TP4 H200 roofline fit, shown as the fallback in `retune status`.
    engine_profile: str | None = None
    # A disaggregated deployment (prefill and decode pools): its prefill workers' profile
    # (None: engine_profile's), and the prefill -> decode KV link in GB/s (64: inter-node
    # InfiniBand, the P/D bandwidth of Dynamo's mocker; ~600 for NVLink). docs/sim.md.
    prefill_engine_profile: str | None = None
    kv_transfer_gb_s: float = Field(64.0, gt=0, le=100_000, allow_inf_nan=False)
    max_shards: int = Field(3, ge=1, le=256)
    time_budget_s: float = Field(240.0, gt=0, allow_inf_nan=False)
    shard_timeout_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    trace_dir: str = "/var/lib/powerfleet/traces"
    lease_duration_s: int = Field(60, ge=5, le=3600)
    lease_renew_s: int = Field(15, ge=1, le=3600)
    history: int = Field(20, ge=1, le=200)  # decisions kept in the state Lease
    # `promote` refuses an advisory recommendation older than this many windows (or one a
    # later window's keep superseded).
    promote_max_age_windows: int = Field(3, ge=0, le=10_000)
    # Frontend trace segments last written longer ago than this are deleted by the window cut
    # (it needs the window and the one before it).
    segment_retention_s: int = Field(86_400, ge=60, le=365 * 86_400)
    # Where shards read the window: "file" (a volume shared with the sweep workers) or "redis"
    # (the cut window kept in Redis until the sweep is final; no shared volume needed).
    window_store: Literal["file", "redis"] = "file"
    per_deployment: dict[str, RetuneDeploymentConfig] = Field(default_factory=dict)

    @field_validator("deployments", "per_deployment")
    @classmethod
    def _deployment_names(cls, v: Any) -> Any:
        # Lease names and Redis keys are built from them: each must be a Kubernetes object name.
        for name in v:
            if not is_node_name(name):
                raise ValueError(f"{name!r} is not a valid Kubernetes object name")
        return v

    @model_validator(mode="after")
    def _phase_within_interval(self) -> "RetuneConfig":
        if self.window_phase_s >= self.window_interval_s:
            raise ValueError("window_phase_s must be less than window_interval_s")
        if self.lease_renew_s >= self.lease_duration_s:
            raise ValueError("retune.lease_renew_s must be less than retune.lease_duration_s")
        return self


class AgentConfig(_Strict):
    """The node agent (docs/agent.md). The node name comes from ``agent --node``."""

    # Cap for a GPU whose pods give no valid cap (an invalid or missing annotation on a pod sharing
    # it): safe_default_fraction of the card's maximum; safe_default_watts overrides when set,
    # clamped into the card's range, and is ignored where it would be at or above the maximum.
    safe_default_fraction: float = Field(0.7, gt=0, lt=1)
    safe_default_watts: int | None = Field(None, ge=1, le=100_000)
    state_dir: str = "/var/lib/powerfleet-agent"  # managed_gpus.json; a hostPath in the chart
    proc_root: str = "/proc"  # the host's /proc (hostPID, or mounted read-only)
    namespaces: list[str] = Field(default_factory=list)  # pods listed/watched here only; empty: all
    gpu_backend: Literal["nvml", "simulated"] = "nvml"
    simulated_dir: str | None = None  # simulated backend: <dir>/<node>.json, shared with the twin
    kubeconfig: str | None = None  # None: the in-cluster service account
    watch: bool = True  # run a pass as soon as an annotated pod on the node changes
    # The kubelet's PodResources socket ({node}: the node's name); absent: map GPUs by process only.
    podresources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    # Write Dynamo's enforcement report annotation on annotated pods (pods get + patch; the chart guards it).
    enforcement_annotation: bool = True
    # Between passes, read the GPUs' process lists this often; a change runs a pass (0: off).
    process_poll_s: float = Field(1.0, ge=0, le=60)
    probe_port: int = Field(0, ge=0, le=65535)  # /readyz and /metrics; 0 disables (the chart sets 8081)
    probe_address: str = "127.0.0.1"
    # Drains (agent/drain.py): a node is drained only if it has, or had this recently, an agent
    # (else `drain --force`); every drain order expires, after drain_ttl_s unless --ttl says (at most drain_max_ttl_s).
    drain_retention_s: float = Field(7 * 86400.0, ge=0, le=366 * 86400.0, allow_inf_nan=False)
    drain_ttl_s: float = Field(7 * 86400.0, ge=1, le=366 * 86400.0, allow_inf_nan=False)
    drain_max_ttl_s: float = Field(30 * 86400.0, ge=1, le=366 * 86400.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _drain_ttl_within_max(self) -> "AgentConfig":
        if self.drain_ttl_s > self.drain_max_ttl_s:
            raise ValueError(f"drain_ttl_s ({self.drain_ttl_s:g}) is above drain_max_ttl_s ({self.drain_max_ttl_s:g})")
        return self

    @field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, v: list[str]) -> list[str]:
        for ns in v:
            if not _NAMESPACE.match(ns):
                raise ValueError(f"{ns!r} is not a valid namespace name")
        return v

    @model_validator(mode="after")
    def _simulated_needs_dir(self) -> "AgentConfig":
        if self.gpu_backend == "simulated" and not self.simulated_dir:
            raise ValueError("gpu_backend 'simulated' needs simulated_dir")
        return self


class DeploymentBudgetConfig(_Strict):
    """One power-aware deployment's budget (docs/budget.md)."""

    power_limit_w: int = Field(ge=1)  # projected ceiling over the requested caps, not measured draw
    max_gpus: int = Field(-1, ge=-1)  # -1: no GPU ceiling
    min_gpus: int = Field(-1, ge=-1)  # -1: no GPU floor
    min_replicas: dict[Literal["prefill", "decode", "worker"], int] = Field(default_factory=dict)  # default 1
    # True: powerfleet is the only writer of this DGD's replicas, even beside a Planner component or
    # after another writer changed them (otherwise such a deployment is reported, never scaled).
    sole_writer: bool = False
    # Which of an oversubscribed group's GPUs the power guard throttles first (docs/power.md).
    priority: Literal["high", "low"] = "high"


class GroupBudgetConfig(_Strict):
    """A group's budget in its object form: ``budget.groups.<g>: {limit_w, oversubscription}``."""

    limit_w: int = Field(ge=1)
    # Requested caps may sum to this many times the limit; the power guard keeps the measured draw
    # under the limit (docs/power.md). 1.0: off (cap-sum budgeting).
    oversubscription: float = Field(1.0, ge=1.0, le=4.0, allow_inf_nan=False)


# budget.groups takes an int (watts) or the object form; the schema shows both (the chart's
# values.schema.json is generated from it), while the model keeps the ints its readers expect.
_GROUP_SCHEMA = {"type": "object", "additionalProperties": {"anyOf": [
    {"type": "integer", "minimum": 1},
    {"type": "object", "additionalProperties": False, "required": ["limit_w"],
     "properties": {"limit_w": {"type": "integer", "minimum": 1},
                    "oversubscription": {"type": "number", "minimum": 1.0, "maximum": 4.0, "default": 1.0}}}]}}


class BudgetConfig(_Strict):
    """The budget planner (docs/budget.md). Power awareness is opt-in: only the DGDs listed in
    ``deployments`` ("namespace/name") are evaluated; the default is none."""

    deployments: dict[str, DeploymentBudgetConfig] = Field(default_factory=dict)
    group_label: str = "powerfleet.io/rack"  # node label whose value names a node's group (rack, PDU)
    # group -> watts shared by the pods on its nodes, or {limit_w, oversubscription} (GroupBudgetConfig)
    groups: Annotated[dict[str, int], WithJsonSchema(_GROUP_SCHEMA)] = Field(default_factory=dict)
    # Filled from the object form of ``groups`` (group -> ratio, only ratios above 1.0); read it
    # through ``oversubscription_of``.
    group_oversubscription: Annotated[dict[str, float], WithJsonSchema({"type": "object", "additionalProperties": {
        "type": "number", "minimum": 1.0, "maximum": 4.0}})] = Field(default_factory=dict)
    kubeconfig: str | None = None  # None: the in-cluster service account
    # Where the budget's status lives: one ConfigMap per deployment (kept by every API server), or
    # "dgd": status.budget on the DGD (only a server that keeps undeclared status fields keeps it).
    status_store: Literal["configmap", "dgd"] = "configmap"
    # What a group's ledger charges per GPU of a pod no listed deployment owns that has neither a
    # power annotation nor a fresh agent enforcement report: the GPU's maximum settable limit.
    max_settable_gpu_w: int = Field(1000, ge=1, le=100_000)
    # How a listed deployment's GPUs are charged from the node agents' enforcement reports
    # (docs/budget.md). auto: on a node whose agent reports (or has reported), each GPU at its
    # enforced limit while its report is fresh, else at max_settable_gpu_w with scale-ups held
    # (enforcement_evidence_stale); on a node no agent ever reported from, the requested cap.
    # required: every node as if its agent reports. off: always the requested cap.
    enforcement_evidence: Literal["auto", "required", "off"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _group_objects(cls, data: Any) -> Any:
        groups = data.get("groups") if isinstance(data, dict) else None
        if not isinstance(groups, dict) or not any(isinstance(v, dict) for v in groups.values()):
            return data
        flat: dict[Any, Any] = {}
        ratios = dict(data.get("group_oversubscription") or {})
        for group, value in groups.items():
            if isinstance(value, dict):
                try:
                    obj = GroupBudgetConfig.model_validate(value)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    field = ".".join(str(p) for p in err["loc"]) or "(value)"
                    msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
                    raise ValueError(f"groups.{group}.{field}: {msg}") from None
                flat[group] = obj.limit_w
                if obj.oversubscription > 1.0:
                    ratios[group] = obj.oversubscription
            else:
                flat[group] = value
        return {**data, "groups": flat, "group_oversubscription": ratios}

    def oversubscription_of(self, group: str) -> float:
        """The group's ratio (1.0: not oversubscribed)."""
        return self.group_oversubscription.get(group, 1.0)

    def oversubscribed(self) -> dict[str, int]:
        """group -> limit (W) of every group with a ratio above 1.0: the groups the power guard keeps."""
        return {g: w for g, w in sorted(self.groups.items()) if self.oversubscription_of(g) > 1.0}

    @field_validator("deployments")
    @classmethod
    def _namespaced(cls, v: dict[str, DeploymentBudgetConfig]) -> dict[str, DeploymentBudgetConfig]:
        for key in v:
            ns, sep, name = key.partition("/")
            if not sep or not ns or not name or "/" in name:
                raise ValueError(f"{key!r} must be 'namespace/name'")
            if not _NAMESPACE.match(ns) or not is_node_name(name):
                raise ValueError(f"{key!r}: not a Kubernetes namespace and object name")
        return v

    @field_validator("groups")
    @classmethod
    def _positive_watts(cls, v: dict[str, int]) -> dict[str, int]:
        for group, watts in v.items():
            if watts < 1:
                raise ValueError(f"group {group!r}: budget must be at least 1 W")
        return v

    @model_validator(mode="after")
    def _ratios_of_groups(self) -> "BudgetConfig":
        for group, ratio in self.group_oversubscription.items():
            if group not in self.groups:
                raise ValueError(f"group_oversubscription names {group!r}, which is not in budget.groups")
            if not 1.0 <= ratio <= 4.0:
                raise ValueError(f"group {group!r}: oversubscription must be between 1.0 and 4.0, got {ratio}")
        return self


class PowerConfig(_Strict):
    """Measured-power oversubscription (docs/power.md): the live guard and admission."""

    # The guard runs once per period per oversubscribed group; overlays expire after 1.5 periods
    # and an agent whose overlays stop falls back to its safe caps within one period.
    guard_period_s: float = Field(1.0, ge=0.2, le=60, allow_inf_nan=False)
    # The guard's overshoot bound: the caps in force sum to at most this many times the limit
    # (power.guard.DEFAULT_CAP_CEILING, the same 1.25; null: off, bounded only by the ratio).
    cap_ceiling: float | None = Field(1.25, ge=1, le=4, allow_inf_nan=False)
    # How long the guard keeps a group's nodes and the priority of their pods before it lists
    # them again (the guard runs every period; a LIST per period would load the API server).
    topology_refresh_s: float = Field(30.0, ge=1, le=3600, allow_inf_nan=False)
    # Admission: the group's measured p99 draw over this window, plus reserve_fraction of its
    # limit, must stay within the limit (power.admission).
    admission_window_s: float = Field(300.0, ge=10, le=86400, allow_inf_nan=False)
    admission_reserve_fraction: float = Field(0.05, ge=0, lt=1, allow_inf_nan=False)


class FleetConfig(_Strict):
    broker: BrokerConfig = BrokerConfig()
    beat: BeatConfig = BeatConfig()
    limits: TimeLimits = TimeLimits()
    flower: FlowerConfig = FlowerConfig()
    task_api: TaskApiConfig = TaskApiConfig()
    metrics: MetricsConfig = MetricsConfig()
    retune: RetuneConfig = RetuneConfig()
    agent: AgentConfig = AgentConfig()
    budget: BudgetConfig = BudgetConfig()
    power: PowerConfig = PowerConfig()
    # GPU nodes always sent a reconcile pass (optional: live agents are found by their heartbeat).
    nodes: list[str] = Field(default_factory=list)
    # Workers that consume the sweep queue always prefetch one task (long shards must not be hoarded).
    prefetch_multiplier: int = Field(4, ge=1, le=64)
    # Tests and the twin only: tasks read "now" (epoch seconds) from this file instead of the
    # system clock, so several worker processes see the same chosen instants.
    clock_file: str | None = None

    @model_validator(mode="after")
    def _visibility_outlasts_tasks(self) -> "FleetConfig":
        # Redis redelivers an unacked (acks_late) message after the visibility timeout, so a
        # task allowed to run longer would run twice in parallel.
        family, hard = max(((f, getattr(self.limits, f).hard_s) for f in ("control", "sweep", "node")),
                           key=lambda x: x[1])
        if hard >= self.broker.visibility_timeout_s:
            raise ValueError(f"broker.visibility_timeout_s ({self.broker.visibility_timeout_s}) must exceed the "
                             f"longest hard time limit (limits.{family}.hard_s = {hard:g})")
        return self

    @field_validator("nodes")
    @classmethod
    def _node_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not is_node_name(name):
                raise ValueError(f"{name!r} is not a valid Kubernetes node name")
        if len(set(v)) != len(v):
            raise ValueError("node names must be unique")
        return v


def _dotted(loc: tuple[Any, ...]) -> str:
    # A key from the file may hold anything (a newline, a dot): quote it so the error stays one line.
    return ".".join(str(p) if re.fullmatch(r"[A-Za-z0-9_-]+", str(p)) else repr(str(p)) for p in loc) or "(top level)"


class _ConfigLoader(yaml.SafeLoader):
    """YAML with only true/false as booleans (the YAML 1.2 core schema). YAML 1.1 also reads
    on/off/yes/no as booleans, so a mode named `off` (budget.enforcement_evidence) arrived as
    false; pydantic still reads those words as booleans where a field is one."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


def _mapping_once(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    from powerfleet.config.overrides import construct_mapping_once  # here: queues.py imports this module

    return construct_mapping_once(loader, node)


_ConfigLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in (ENV_CONFIG_FILE, "POWERFLEET_INPUT_TIMEOUT_S"):  # textinput's
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
        if not all(path):
            raise ConfigError(f"environment {key}: empty key segment")
        try:
            value = _load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        except RecursionError:
            raise ConfigError(f"environment {key}: nested too deeply to parse") from None
        node = tree
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"environment {key}: {'.'.join(path)} conflicts with another variable")
            node = nxt
        node[path[-1]] = value
    return tree


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    from powerfleet.textinput import InputError, read_text, too_deep

    try:
        text = read_text(path)  # bounded: /dev/zero as --config is refused, not read forever
    except InputError as exc:
        if exc.reason.startswith("cannot read"):
            raise ConfigError(f"{path}: cannot read config file {exc.reason.removeprefix('cannot read it ')}") from None
        raise ConfigError(f"{path}: config file {exc.reason}") from None
    try:
        data = _load_yaml(text)
    except RecursionError:
        raise ConfigError(f"{path}: {too_deep('the YAML')}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}:{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> FleetConfig:
    """Build the FleetConfig. Raises ConfigError with the source and dotted key on any problem."""
    environ = os.environ if environ is None else environ
    if path is None and environ.get(ENV_CONFIG_FILE):
        path = environ[ENV_CONFIG_FILE]
    from powerfleet.config.overrides import check_file_under_overrides, env_key_of, find_nan

    file_data = _read_yaml(Path(path)) if path is not None else {}
    env_data = _env_overrides(environ)
    for tree, source in ((file_data, str(path)), (env_data, f"{ENV_PREFIX}* environment")):
        nan = find_nan(tree)
        if nan is not None:
            raise ConfigError(f"{source}: {_dotted(nan)}: .nan is not a number")
    try:
        bad = check_file_under_overrides(file_data, env_data, _deep_merge, FleetConfig.model_validate)
    except RecursionError:
        bad = None  # reported by the merged validation below
    if bad is not None:
        var = ENV_PREFIX + "__".join(str(p).upper() for p in env_key_of(env_data, bad[0]))
        raise ConfigError(f"{path}: {_dotted(bad[0])}: {bad[1]} (overridden by {var}, but the file's value is invalid)")
    try:
        return FleetConfig.model_validate(_deep_merge(file_data, env_data))
    except RecursionError:
        raise ConfigError(f"{path or 'environment'}: nested too deeply to validate") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        key = _dotted(loc)
        source = str(path) if path is not None else "defaults"
        if loc and _in_tree(env_data, loc):
            source = ENV_PREFIX + "__".join(str(p).upper() for p in loc)
        elif not loc and env_data:
            source = f"{source} + {ENV_PREFIX}* environment" if path is not None else f"{ENV_PREFIX}* environment"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        where = f"{key}: " if loc else ""  # cross-field checks name their keys in the message
        raise ConfigError(f"{source}: {where}{msg}{more}") from None


def _in_tree(tree: Mapping[str, Any], loc: tuple[Any, ...]) -> bool:
    node: Any = tree
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False
    return True
