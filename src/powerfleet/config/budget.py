"""The budget planner's and the power guard's settings (docs/budget.md, docs/power.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, WithJsonSchema, field_validator, model_validator

from powerfleet.config.base import NAMESPACE, Strict, is_node_name


class DeploymentBudgetConfig(Strict):
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


class GroupBudgetConfig(Strict):
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


class BudgetConfig(Strict):
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
    # Where a tick's ledger reads every pod from. list: one paginated LIST per tick (exact, and
    # cheap up to a few thousand pods). watch: each control process keeps the pods the ledger
    # reads in memory from one LIST and a WATCH (cluster/gpu_pod_cache.py), and a tick LISTs for
    # itself only while that view is not synced: for large clusters (docs/deploy.md, sizing).
    pod_source: Literal["list", "watch"] = "list"

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
            if not NAMESPACE.match(ns) or not is_node_name(name):
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


class PowerConfig(Strict):
    """Measured-power oversubscription (docs/power.md): the live guard and admission."""

    # The guard runs once per period per oversubscribed group; overlays expire after 1.5 periods
    # and an agent whose overlays stop falls back to its safe caps within one period.
    guard_period_s: float = Field(1.0, ge=0.2, le=60, allow_inf_nan=False)
    # Who keeps the guard's periods: "process" (`powerfleet power guard`, one process on its own
    # deadlines: power/loop.py; `up`, the demo and the chart start it when a group is
    # oversubscribed, and beat then has no guard entries) or "beat" (a beat entry per group, run by a
    # control worker). The default is the process: beat's path is four processes' scheduling, each
    # of which slips under CPU contention (docs/power.md, "Who keeps the periods": 7 late and 3 lost
    # periods in 85 under beat, none in 95 under the process, beside two busy loops).
    guard_runner: Literal["beat", "process"] = "process"
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
