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
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "POWERFLEET_"
ENV_CONFIG_FILE = "POWERFLEET_CONFIG"
# Kubernetes node names are DNS subdomains; queue names are built from them.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def is_node_name(name: str) -> bool:
    return _NODE_NAME.match(name) is not None


class ConfigError(Exception):
    """A config problem, already phrased as one line for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerConfig(_Strict):
    # None: start a private redis-server on loopback (see powerfleet.broker.embedded).
    url: str | None = None
    result_backend: str | None = None  # defaults to the broker URL
    # Must exceed the longest acks_late task, or Redis redelivers it while it still runs.
    visibility_timeout_s: int = Field(3600, ge=60, le=7 * 86400)
    # Every tick stores a small result: a day of them at the default rates is ~36 MB of Redis
    # (docs/reliability.md measured ~1.5 MB per hour); a week would be ~250 MB.
    result_expires_s: int = Field(86400, ge=3600)

    @field_validator("url", "result_backend")
    @classmethod
    def _redis_scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return v


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
    max_shards: int = Field(3, ge=1, le=256)
    time_budget_s: float = Field(240.0, gt=0, allow_inf_nan=False)
    shard_timeout_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    trace_dir: str = "/var/lib/powerfleet/traces"
    lease_duration_s: int = Field(60, ge=5, le=3600)
    lease_renew_s: int = Field(15, ge=1, le=3600)
    history: int = Field(20, ge=1, le=200)  # decisions kept in the state Lease
    # Where shards read the window: "file" (a volume shared with the sweep workers) or "redis"
    # (the cut window kept in Redis until the sweep is final; no shared volume needed).
    window_store: Literal["file", "redis"] = "file"
    per_deployment: dict[str, RetuneDeploymentConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _phase_within_interval(self) -> "RetuneConfig":
        if self.window_phase_s >= self.window_interval_s:
            raise ValueError("window_phase_s must be less than window_interval_s")
        if self.lease_renew_s >= self.lease_duration_s:
            raise ValueError("retune.lease_renew_s must be less than retune.lease_duration_s")
        return self


class AgentConfig(_Strict):
    """The node agent (docs/agent.md). The node name comes from ``agent --node``."""

    # Cap for a GPU whose pods' annotations are invalid or disagree (about 70% of the default TGP).
    safe_default_watts: int = Field(500, ge=1, le=100_000)
    state_dir: str = "/var/lib/powerfleet-agent"  # managed_gpus.json; a hostPath in the chart
    proc_root: str = "/proc"  # the host's /proc (hostPID, or mounted read-only)
    namespaces: list[str] = Field(default_factory=list)  # pods listed/watched here only; empty: all
    gpu_backend: Literal["nvml", "simulated"] = "nvml"
    simulated_dir: str | None = None  # simulated backend: <dir>/<node>.json, shared with the twin
    kubeconfig: str | None = None  # None: the in-cluster service account
    watch: bool = True  # run a pass as soon as an annotated pod on the node changes
    probe_port: int = Field(0, ge=0, le=65535)  # /readyz and /metrics; 0 disables (the chart sets 8081)
    probe_address: str = "127.0.0.1"

    @field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, v: list[str]) -> list[str]:
        for ns in v:
            if not re.match(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", ns):
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


class BudgetConfig(_Strict):
    """The budget planner (docs/budget.md). Power awareness is opt-in: only the DGDs listed in
    ``deployments`` ("namespace/name") are evaluated; the default is none."""

    deployments: dict[str, DeploymentBudgetConfig] = Field(default_factory=dict)
    group_label: str = "powerfleet.io/rack"  # node label whose value names a node's group (rack, PDU)
    groups: dict[str, int] = Field(default_factory=dict)  # group -> watts shared by the pods on its nodes
    kubeconfig: str | None = None  # None: the in-cluster service account
    # Where the budget's status lives: one ConfigMap per deployment (kept by every API server), or
    # "dgd": status.budget on the DGD (only a server that keeps undeclared status fields keeps it).
    status_store: Literal["configmap", "dgd"] = "configmap"
    # What a group's ledger charges per GPU of a pod no listed deployment owns that has neither a
    # power annotation nor a fresh agent enforcement report: the GPU's maximum settable limit.
    max_settable_gpu_w: int = Field(1000, ge=1, le=100_000)
    # True once the node agents publish enforcement reports: a listed deployment's GPU is charged at
    # its requested cap only while a fresh report shows it enforced; otherwise at max_settable_gpu_w,
    # with scale-ups held (enforcement_evidence_stale). False: the requested caps, as reported.
    require_enforcement_evidence: bool = False

    @field_validator("deployments")
    @classmethod
    def _namespaced(cls, v: dict[str, DeploymentBudgetConfig]) -> dict[str, DeploymentBudgetConfig]:
        for key in v:
            ns, sep, name = key.partition("/")
            if not sep or not ns or not name or "/" in name:
                raise ValueError(f"{key!r} must be 'namespace/name'")
        return v

    @field_validator("groups")
    @classmethod
    def _positive_watts(cls, v: dict[str, int]) -> dict[str, int]:
        for group, watts in v.items():
            if watts < 1:
                raise ValueError(f"group {group!r}: budget must be at least 1 W")
        return v


class FleetConfig(_Strict):
    broker: BrokerConfig = BrokerConfig()
    beat: BeatConfig = BeatConfig()
    limits: TimeLimits = TimeLimits()
    flower: FlowerConfig = FlowerConfig()
    metrics: MetricsConfig = MetricsConfig()
    retune: RetuneConfig = RetuneConfig()
    agent: AgentConfig = AgentConfig()
    budget: BudgetConfig = BudgetConfig()
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


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key == ENV_CONFIG_FILE:
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
        if not all(path):
            raise ConfigError(f"environment {key}: empty key segment")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: config file is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
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
    file_data = _read_yaml(Path(path)) if path is not None else {}
    env_data = _env_overrides(environ)
    try:
        return FleetConfig.model_validate(_deep_merge(file_data, env_data))
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
