"""A scenario file's cluster, made into the twin's options and the fleet's settings (pure but for
reading the traces).

``twin_parts(scenario, file)`` gives the ``TwinOptions`` fields (layout, DGDs, tenants, rack
limits, traffic); ``fleet_values(scenario, twin)`` the ``POWERFLEET_*`` settings that point the
fleet at the deployments and racks the scenario names (demo_cmd.config_env form).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.twin.cluster.manifests import dgd_manifests
from powerfleet.twin.demo.scenario_model import Scenario
from powerfleet.twin.demo.scenario_tenants import tenant_pod
from powerfleet.twin.cluster.topology import GPU_MAX_W, NodeLayout, TwinSpec
from powerfleet.twin.serving.traffic import TRACE_FILES, TrafficSource, find_traces, synthetic_requests


@dataclass(frozen=True)
class TwinParts:
    spec: TwinSpec
    manifests: tuple[dict[str, Any], ...]
    tenant_pods: tuple[dict[str, Any], ...]
    tenant_load: dict[str, float]
    rack_limit_w: dict[str, float]
    traffic: Callable[[int, float], tuple[str, dict[str, TrafficSource]]]


def layout(scenario: Scenario) -> tuple[NodeLayout, ...]:
    return tuple(NodeLayout(rack, g.gpus, g.model, tuple(sorted(g.labels.items())),
                            tuple((t.key, t.value, t.effect) for t in g.taints))
                 for rack, r in scenario.topology.racks.items() for g in r.nodes for _ in range(g.count))


def twin_parts(scenario: Scenario, file: Path, *, seed: int = 0, traces: Path | None = None) -> TwinParts:
    spec = TwinSpec.of_layout(layout(scenario), seed=seed, namespace=scenario.topology.namespace)
    taken: dict[str, set[int]] = {}
    pods = []
    for t in scenario.tenants:
        node = t.node or (spec.racks[t.rack][0] if t.rack else None)
        pods.append(tenant_pod(spec, t.name, t.gpus, t.power_w, node=node, taken=taken, grace_s=t.grace_s,
                               tolerations=[x.as_k8s() for x in t.tolerations]))
    loads = {t.name: float(t.load) for t in scenario.tenants}
    limits = {rack: float(r.limit_w) for rack, r in scenario.topology.racks.items() if r.limit_w is not None}
    return TwinParts(spec, tuple(manifests(scenario, spec)), tuple(pods), loads, limits,
                     lambda s, speedup: traffic(scenario, file, s, speedup, traces))


def manifests(scenario: Scenario, spec: TwinSpec) -> list[dict[str, Any]]:
    """The scenario's DGDs: the twin's built-in ones it names and its own manifests, with its replicas,
    caps and tolerations over them (a key of ``replicas``/``caps_w`` is a role: the component that plays
    it, as the fleet reads the layout), in the topology's namespace, labelled for the budget and retune."""
    builtin = {obj["metadata"]["name"]: obj for obj in dgd_manifests(spec)}
    out = []
    for name, d in scenario.deployments.items():
        obj = copy.deepcopy(builtin[d.builtin] if d.builtin is not None else d.manifest)
        assert obj is not None
        roles = d.roles(name)
        meta = obj.setdefault("metadata", {})
        meta.update(name=name, namespace=spec.namespace)
        meta.setdefault("labels", {}).update({"powerfleet.io/power-aware": "true",
                                              "powerfleet.io/retune": str(d.retune).lower()})
        services = _services(obj)
        for role, n in d.replicas.items():
            services[_component(roles, role, name, "replicas")]["replicas"] = n
        for role, w in d.caps_w.items():
            svc = services[_component(roles, role, name, "caps_w")]
            svc.setdefault("extraPodMetadata", {}).setdefault("annotations", {})[POWER_ANNOTATION] = str(w)
        if d.tolerations:
            for svc in services.values():
                pod = svc.setdefault("extraPodSpec", {})
                pod["tolerations"] = list(pod.get("tolerations") or []) + [t.as_k8s() for t in d.tolerations]
        out.append(obj)
    return out


def _component(roles: Mapping[str, str], role: str, name: str, key: str) -> str:
    if role not in roles:
        raise ValueError(f"deployments.{name}.{key}.{role}: {name} has no {role} component (it has "
                         f"{', '.join(sorted(roles))})")
    return roles[role]


def _services(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services of a DGD in the v1alpha1 form; a v1beta1 manifest's components are converted by the
    twin's API server (twin/apiserver/conversion.py) on the way in and served back in this form."""
    spec = obj.setdefault("spec", {})
    if "services" in spec:
        return spec["services"]
    from powerfleet.twin.apiserver.conversion import DGD_KEY, convert

    converted = convert(DGD_KEY, obj, "v1alpha1")
    obj.clear()
    obj.update(converted)
    return obj["spec"]["services"]


def traffic(scenario: Scenario, file: Path, seed: int, speedup: float,
            traces: Path | None) -> tuple[str, dict[str, TrafficSource]]:
    """(description, {deployment: source}); a deployment the traffic section leaves out gets the
    conversation trace. Without the shipped traces, the synthetic stand-in (the report says so)."""
    from powerfleet.sim.trace import read_trace
    from powerfleet.twin.demo.scenario_load import trace_path

    found = find_traces(traces)
    out: dict[str, TrafficSource] = {}
    said: list[str] = []
    for i, name in enumerate(scenario.deployments):
        tr = scenario.traffic.get(name)
        trace, offset = (tr.trace, float(tr.offset_s)) if tr else ("conversation", 1800.0 * i)
        if trace in TRACE_FILES and found is not None:
            path = found / TRACE_FILES[trace]
            reqs, what = read_trace(path).requests, str(path)
        elif trace in TRACE_FILES:
            reqs, what = synthetic_requests(seed), "synthetic (no trace directory found)"
        else:
            path = trace_path(file, trace)
            reqs, what = read_trace(path).requests, str(path)
        out[name] = TrafficSource.from_requests(name, reqs, speedup=speedup, seed=seed + i, offset_s=offset)
        said.append(f"{name}: {what}")
    return "; ".join(said), out


def multiplier_at(scenario: Scenario, deployment: str, t_s: float) -> float:
    """The rate multiplier in force at ``t_s`` seconds into the run (1 before the first)."""
    from powerfleet.twin.demo.scenario_model import at_s

    tr = scenario.traffic.get(deployment)
    x = 1.0
    if tr is None:
        return x
    for m in sorted(tr.multipliers, key=lambda m: at_s(m.at, scenario.duration_s)):
        if at_s(m.at, scenario.duration_s) <= t_s:
            x = float(m.x)
    return x


def fleet_values(scenario: Scenario, spec: TwinSpec, group_budgets: Mapping[str, int]) -> dict[str, str]:
    """The budget and retune settings for the scenario's deployments and racks. ``group_budgets``:
    each rack's planning budget (demo_cmd.planner_group_budgets)."""
    ns, top = spec.namespace, spec.total_gpus * GPU_MAX_W
    deployments = []
    for name, d in scenario.deployments.items():
        fields = [f"power_limit_w: {d.budget.power_limit_w or top}", f"sole_writer: {str(d.budget.sole_writer).lower()}"]
        if d.budget.priority:
            fields.append(f"priority: {d.budget.priority}")
        deployments.append(f"{ns}/{name}: {{{', '.join(fields)}}}")
    groups = []
    for rack, w in group_budgets.items():
        ratio = float(scenario.topology.racks[rack].oversubscription)
        groups.append(f"{rack}: {{limit_w: {w}, oversubscription: {ratio}}}" if ratio > 1 else f"{rack}: {w}")
    return {"budget.deployments": "{" + ", ".join(deployments) + "}", "budget.groups": "{" + ", ".join(groups) + "}",
            "retune.deployments": "[" + ", ".join(n for n, d in scenario.deployments.items() if d.retune) + "]"}


def resized(scenario: Scenario, nodes: int) -> Scenario:
    """The scenario on ``nodes`` nodes of its first node group's kind: rack-a the first half
    (rounded up), rack-b the rest (``--nodes`` on the default demo's two racks); a tenant of a rack
    that is gone is left out, and a one-node twin has none (its DGDs fill the node)."""
    first = next(iter(scenario.topology.racks.values())).nodes[0]
    split = {"rack-a": (nodes + 1) // 2, "rack-b": nodes // 2}
    old = scenario.topology.racks
    racks = {rack: {"limit_w": old[rack].limit_w if rack in old else None,
                    "oversubscription": old[rack].oversubscription if rack in old else 1.0,
                    "nodes": [{**first.model_dump(), "count": n}]} for rack, n in split.items() if n}
    names = {f"twin-gpu-{i:02d}" for i in range(nodes)}
    tenants = [t.model_dump() for t in scenario.tenants if nodes > 1
               and (t.rack is None or t.rack in racks) and (t.node is None or t.node in names)]
    data = scenario.model_dump(exclude={"topology", "tenants"})
    data["topology"] = {"racks": racks, "namespace": scenario.topology.namespace}
    data["tenants"] = tenants
    return Scenario.model_validate(data)
