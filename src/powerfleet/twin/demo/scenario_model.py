"""The scenario file's format (docs/twin.md "Scenario files"): pydantic models, strict.

A scenario describes a cluster (racks with limits, GPU nodes), the deployments on it, the
other tenants, the traffic, the events at their times and the checks to judge. Every model
refuses unknown keys and coerces nothing (``"8"`` is not a GPU count); numbers are bounded so
that a typo cannot ask the twin for a million nodes. ``scenarios/schema.json`` is generated
from these models (``python -m powerfleet.twin.demo.scenario_load --schema``).

A deployment is one of the twin's two built-in DGDs or the operator's own manifest (inline or
by path: twin/demo/scenario_manifests.py checks it against the DGD schema and the fleet's reading).
What the twin cannot really do is refused here with the reason, never accepted and ignored:
card models outside the H100 family (its power model and simulated GPUs are an H100's).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, StrictBool, StrictFloat, StrictInt, ValidationInfo, model_validator

from powerfleet.twin.cluster.topology import GPU_MAX_W, GPU_MIN_W
# The topology's models (racks, node groups, taints, tolerations) and the strict base, re-exported.
from powerfleet.twin.demo.scenario_topology import (  # noqa: F401
    NAME, Name, NodeGroup, Rack, Taint, Toleration, Topology, Watts, _Strict)

Fraction = Annotated[Union[StrictFloat, StrictInt], Field(ge=0, le=1)]
MAX_EVENTS = 200
MAX_DURATION_S = 86_400
ROLES = ("prefill", "decode", "worker")
BUILTINS = ("llm-disagg", "llm-agg")
BUILTIN_ROLES = {"llm-disagg": {"frontend": "frontend", "planner": "planner", "prefill": "prefill", "decode": "decode"},
                 "llm-agg": {"frontend": "frontend", "planner": "planner", "worker": "worker"}}
TRACES = ("conversation", "synthetic")
_AT = re.compile(r"^(\d{1,3}(\.\d+)?)%$")


# -- deployments --


class Sla(_Strict):
    ttft_ms: Annotated[Union[StrictFloat, StrictInt], Field(gt=0, le=3_600_000)]
    judged_from: Union[StrictFloat, StrictInt, str] = Field(
        0, description="windows starting before this time (seconds, or '40%') are not judged: the time a "
                       "planner following the load needs")
    itl_ms: Annotated[Union[StrictFloat, StrictInt], Field(gt=0, le=3_600_000)] | None = Field(
        None, description="mean inter-token latency per window (ms); a window is within the SLA when both hold")


class Budget(_Strict):
    power_limit_w: Watts | None = None  # null: the whole fleet's GPU power (the racks bind)
    priority: Literal["high", "normal", "low"] | None = None
    sole_writer: StrictBool = True


class Deployment(_Strict):
    builtin: Literal["llm-disagg", "llm-agg"] | None = Field(
        None, description="one of the twin's DynamoGraphDeployments (twin/cluster/manifests.py); or give manifest "
                          "or manifest_file")
    manifest: dict[str, Any] | None = Field(
        None, description="a DynamoGraphDeployment manifest (nvidia.com/v1alpha1 or v1beta1), checked against the "
                          "DGD schema; metadata.name is the deployment's key")
    manifest_file: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        None, description="a YAML file holding one DynamoGraphDeployment (relative to the scenario file)")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16,
                                          description="added to every component's pods (tainted nodes)")
    replicas: dict[Literal["frontend", "planner", "prefill", "decode", "worker"],
                   Annotated[StrictInt, Field(ge=0, le=256)]] = Field(default_factory=dict)
    caps_w: dict[Literal["prefill", "decode", "worker"], Annotated[StrictInt, Field(ge=GPU_MIN_W, le=GPU_MAX_W)]] = \
        Field(default_factory=dict, description="the power annotation per role (default: 600/450/500 W)")
    budget: Budget = Budget()
    retune: StrictBool = True
    sla: Sla | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_file(cls, data: Any, info: ValidationInfo) -> Any:
        """``manifest_file`` read (relative to the scenario file's directory) into ``manifest``."""
        if isinstance(data, dict) and isinstance(data.get("manifest_file"), str):
            if data.get("manifest") is not None:
                raise ValueError("give manifest or manifest_file, not both")
            from powerfleet.twin.demo.scenario_manifests import read_manifest

            base = (info.context or {}).get("base") if isinstance(info.context, dict) else None
            path = Path(data["manifest_file"])
            data = {**data, "manifest": read_manifest(path if path.is_absolute() or base is None else Path(base) / path)}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> "Deployment":
        if (self.builtin is None) == (self.manifest is None):
            raise ValueError("give one of builtin, manifest or manifest_file")
        if self.manifest is not None:
            self.roles()  # checked here; its name against the deployment's key by the scenario
        return self

    def roles(self, name: str | None = None) -> dict[str, str]:
        """Role (prefill, decode, worker, frontend, planner) -> component name."""
        if self.builtin is not None:
            return dict(BUILTIN_ROLES[self.builtin])
        from powerfleet.twin.demo.scenario_manifests import check_manifest

        assert self.manifest is not None
        return check_manifest(self.manifest, name)


# -- tenants --


class Tenant(_Strict):
    name: Name
    node: Annotated[str, Field(pattern=r"^twin-gpu-\d{2}$")] | None = Field(
        None, description="bound to this node (its last free GPUs)")
    rack: Name | None = Field(None, description="bound to the rack's first node; neither node nor rack: Pending "
                                                "until a node has its GPUs free, then scheduled there")
    gpus: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    power_w: Annotated[StrictInt, Field(ge=GPU_MIN_W, le=GPU_MAX_W)] | None = None
    load: Fraction = 0.5
    grace_s: Annotated[StrictInt, Field(ge=0, le=3600)] = Field(30, description="terminationGracePeriodSeconds")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16,
                                          description="what the scheduler lets it run beside (tainted nodes)")

    @model_validator(mode="after")
    def _one_place(self) -> "Tenant":
        if self.node is not None and self.rack is not None:
            raise ValueError("give node or rack, not both")
        return self


# -- traffic --


class Multiplier(_Strict):
    at: Union[StrictFloat, StrictInt, str]
    x: Annotated[Union[StrictFloat, StrictInt], Field(ge=0, le=100)]


class Traffic(_Strict):
    trace: str = Field("conversation", description="conversation, synthetic, or a path to a Mooncake JSONL trace")
    offset_s: Annotated[Union[StrictFloat, StrictInt], Field(ge=0, le=1_000_000)] = 0
    multipliers: list[Multiplier] = Field(default_factory=list, max_length=100)


# -- events --


class _Event(_Strict):
    at: Union[StrictFloat, StrictInt, str] = Field(description="seconds from the start, or a share of the run: '25%'")
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")] | None = Field(
        None, description="the event's check in the report (default: <kind>-<index>)")


class SetLimit(_Event):
    kind: Literal["set_limit"]
    rack: Name
    limit_w: Watts


class Propose(_Event):
    kind: Literal["propose"]
    deployment: Name
    replicas: dict[Literal["prefill", "decode", "worker"], Annotated[StrictInt, Field(ge=0, le=256)]] = Field(
        min_length=1)
    readmit: StrictBool = False
    expect: Literal["applied", "clamped"] = "applied"


class ProposeLoad(_Event):
    kind: Literal["propose_load"]
    deployment: Name
    target_per_replica: dict[Literal["prefill", "decode", "worker"],
                             Annotated[Union[StrictFloat, StrictInt], Field(gt=0, le=10_000_000)]] = Field(min_length=1)
    every_s: Annotated[Union[StrictFloat, StrictInt], Field(ge=5, le=3600)] | None = None
    readmit: StrictBool = False


class SetAnnotation(_Event):
    kind: Literal["set_annotation"]
    deployment: Name
    component: Literal["prefill", "decode", "worker"]
    watts: Annotated[StrictInt, Field(ge=GPU_MIN_W, le=GPU_MAX_W)]


class AddTenant(_Event):
    kind: Literal["add_tenant"]
    tenant: Tenant


class DeletePod(_Event):
    kind: Literal["delete_pod"]
    pod: Annotated[str, Field(min_length=1, max_length=253)]


class NodeEvent(_Event):
    kind: Literal["kill_agent", "restart_agent"]
    node: Annotated[str, Field(pattern=r"^twin-gpu-\d{2}$")]


class FlushRedis(_Event):
    kind: Literal["flush_redis"]


class KillBroker(_Event):
    kind: Literal["kill_broker"]
    down_s: Annotated[Union[StrictFloat, StrictInt], Field(ge=0, le=60)] = Field(
        2, description="how long the broker stays down before it starts again on its port (empty)")


class TelemetryFault(_Event):
    kind: Literal["telemetry_fault"]
    node: Annotated[str, Field(pattern=r"^twin-gpu-\d{2}$")]
    duration_s: Union[Annotated[Union[StrictFloat, StrictInt], Field(gt=0, le=MAX_DURATION_S)], str] = Field(
        description="seconds, or a share of the run ('20%')")


class SetLoad(_Event):
    kind: Literal["set_load"]
    deployment: Name | None = Field(None, description="null: every deployment")
    x: Annotated[Union[StrictFloat, StrictInt], Field(ge=0, le=100)] = Field(
        description="each worker's load times x (heavier requests at the same rate: a demand surge)")
    duration_s: Union[Annotated[Union[StrictFloat, StrictInt], Field(gt=0, le=MAX_DURATION_S)], str] = Field(
        description="seconds, or a share of the run ('20%')")


class RecreateDgd(_Event):
    kind: Literal["recreate_dgd"]
    deployment: Name


class PatchRouter(_Event):
    kind: Literal["patch_router"]
    deployment: Name
    policy: dict[Literal["overlap_score_credit", "prefill_load_scale", "temperature"],
                 Annotated[Union[StrictFloat, StrictInt], Field(ge=0, le=100)]] = Field(min_length=1)
    after_retune_applied: StrictBool = Field(False, description="wait until retune applied a decision first")
    expect: Literal["applied", "reverted"] = "applied"


Event = Annotated[Union[SetLimit, Propose, ProposeLoad, SetAnnotation, AddTenant, DeletePod, NodeEvent, FlushRedis,
                        KillBroker, TelemetryFault, SetLoad, RecreateDgd, PatchRouter], Field(discriminator="kind")]

EVENT_KINDS = ("set_limit", "propose", "propose_load", "set_annotation", "add_tenant", "delete_pod", "kill_agent",
               "restart_agent", "flush_redis", "kill_broker", "telemetry_fault", "set_load", "recreate_dgd",
               "patch_router")
CHECKS = ("power_within_budget", "no_rack_over_limit", "caps_match_annotations", "retune_windows_decided",
          "retune_applied", "no_unexpected_task_failures", "slo", "events")


class Scenario(_Strict):
    version: Literal[1]
    name: Name
    description: Annotated[str, Field(max_length=4000)] = ""
    duration_s: Annotated[Union[StrictFloat, StrictInt], Field(ge=30, le=MAX_DURATION_S)] = 180
    topology: Topology
    deployments: dict[Name, Deployment] = Field(min_length=1, max_length=8)
    tenants: list[Tenant] = Field(default_factory=list, max_length=64)
    traffic: dict[Name, Traffic] = Field(default_factory=dict)
    events: list[Event] = Field(default_factory=list, max_length=MAX_EVENTS)
    checks: list[Literal["power_within_budget", "no_rack_over_limit", "caps_match_annotations",
                         "retune_windows_decided", "retune_applied", "no_unexpected_task_failures", "slo",
                         "events", "power_guard"]] = Field(default_factory=lambda: list(CHECKS), min_length=1)

    @model_validator(mode="after")
    def _references(self) -> "Scenario":
        for name, d in self.deployments.items():
            if d.builtin is not None and name != d.builtin:
                raise ValueError(f"deployments.{name}: a builtin deployment is named by its builtin ({d.builtin}); "
                                 "give your own DGD as manifest or manifest_file")
            if d.manifest is not None:
                ns = (d.manifest.get("metadata") or {}).get("namespace")
                if ns not in (None, self.topology.namespace):
                    raise ValueError(f"deployments.{name}.manifest.metadata.namespace: {ns!r} is not the topology's "
                                     f"namespace {self.topology.namespace!r}")
        roles = {}
        for name, d in self.deployments.items():
            try:
                roles[name] = d.roles(name)
            except ValueError as exc:
                raise ValueError(f"deployments.{name}: {exc}") from None
        for name in self.traffic:
            if name not in self.deployments:
                raise ValueError(f"traffic.{name}: no such deployment")
        nodes = {f"twin-gpu-{i:02d}" for i in range(sum(g.count for r in self.topology.racks.values()
                                                        for g in r.nodes))}
        tenants = [t.name for t in self.tenants] + [e.tenant.name for e in self.events if isinstance(e, AddTenant)]
        if len(set(tenants)) != len(tenants):
            raise ValueError("tenants: a tenant name is used twice")
        for i, t in enumerate(self.tenants):
            if t.node is not None and t.node not in nodes:
                raise ValueError(f"tenants.{i}.node: {t.node} is not a node of the topology")
            if t.rack is not None and t.rack not in self.topology.racks:
                raise ValueError(f"tenants.{i}.rack: {t.rack} is not a rack of the topology")
        if "power_guard" in self.checks:
            self._guard_contract()
        names = [e.name for e in self.events if e.name]
        if len(set(names)) != len(names):
            raise ValueError("events: an event name is used twice")
        for i, e in enumerate(self.events):
            where = f"events.{i}"
            if isinstance(e, AddTenant) and e.tenant.rack is not None and e.tenant.rack not in self.topology.racks:
                raise ValueError(f"{where}.tenant.rack: {e.tenant.rack} is not a rack of the topology")
            at_s(e.at, self.duration_s, f"{where}.at")
            if isinstance(e, (TelemetryFault, SetLoad)):
                at_s(e.duration_s, self.duration_s, f"{where}.duration_s")
            dep = getattr(e, "deployment", None)
            if dep is not None and dep not in self.deployments:
                raise ValueError(f"{where}.deployment: {dep} is not a deployment of the scenario")
            asked = list(getattr(e, "replicas", None) or getattr(e, "target_per_replica", None) or {}) + (
                [e.component] if isinstance(e, SetAnnotation) else [])
            for role in asked:
                if dep is not None and role not in roles[dep]:
                    raise ValueError(f"{where}: {dep} has no {role} role (it has "
                                     f"{', '.join(r for r in sorted(roles[dep]) if r in ROLES)})")
            if hasattr(e, "rack") and e.rack not in self.topology.racks:
                raise ValueError(f"{where}.rack: {e.rack} is not a rack of the topology")
            node = getattr(e, "node", None) or (e.tenant.node if isinstance(e, AddTenant) else None)
            if node is not None and node not in nodes:
                raise ValueError(f"{where}: {node} is not a node of the topology")
        for name, d in self.deployments.items():
            if d.sla is not None:
                at_s(d.sla.judged_from, self.duration_s, f"deployments.{name}.sla.judged_from")
        for name, tr in self.traffic.items():
            for j, m in enumerate(tr.multipliers):
                at_s(m.at, self.duration_s, f"traffic.{name}.multipliers.{j}.at")
        return self


    def _guard_contract(self) -> None:
        """``power_guard`` (twin/demo/oversubscribe.py, docs/power.md) judges the live power guard on one
        oversubscribed rack through one demand surge and one node's telemetry loss: its own checks."""
        over = [g for g, r in self.topology.racks.items() if r.oversubscription > 1]
        kinds = sorted(e.kind for e in self.events)
        if len(over) != 1 or kinds != ["set_load", "telemetry_fault"] or len(self.checks) > 2 or (
                len(self.checks) == 2 and "no_unexpected_task_failures" not in self.checks):
            raise ValueError("checks: power_guard judges one rack with oversubscription > 1 through one set_load "
                             "and one telemetry_fault event, beside no_unexpected_task_failures only")
        if self.tenants or any(d.retune for d in self.deployments.values()):
            raise ValueError("checks: power_guard runs without tenants and with retune off")


def at_s(at: float | int | str, duration_s: float, where: str = "at") -> float:
    """An event's time in seconds from the start: a number of seconds, or ``'NN%'`` of the run."""
    if isinstance(at, str):
        m = _AT.match(at)
        if not m or float(m.group(1)) > 100:
            raise ValueError(f"{where}: {at!r} is neither seconds nor a share of the run such as '25%'")
        return duration_s * float(m.group(1)) / 100.0
    if not 0 <= at <= duration_s:
        raise ValueError(f"{where}: {at} s is outside the run (0..{duration_s:g} s)")
    return float(at)
