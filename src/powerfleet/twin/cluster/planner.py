"""A stand-in for Dynamo's Planner: another writer of a DGD's replicas, on its own schedule
(docs/twin.md, "Other writers").

A DGD with a component of type ``planner`` gets one. The first time it sees the DGD it records
the replicas of the worker-like components (``worker``/``prefill``/``decode``, or a
``subComponentType`` of prefill/decode): that is what its own model wants. Every ``period_s``
(the injected clock) it writes them back wherever they differ, as a real planner re-applies its
decision each interval whoever changed the count meanwhile: to the component's scaling adapter
when it has one (``adapter_replicas``), else to the DGD (``dgd_replicas``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from powerfleet.twin.cluster.adapters import adapter_name, enabled_components

WORKER_LIKE = frozenset({"worker", "prefill", "decode"})


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass
class PlannerWrites:
    dgd_replicas: dict[str, dict[str, int]] = field(default_factory=dict)
    adapter_replicas: dict[str, int] = field(default_factory=dict)


def _workers(dgd: Mapping[str, Any]) -> dict[str, int] | None:
    """Worker-like component -> replicas; None when the DGD has no planner component."""
    services = _map(_map(dgd.get("spec")).get("services"))
    kinds = {str(n): (str(_map(s).get("componentType", "")), str(_map(s).get("subComponentType", "")))
             for n, s in services.items()}
    if not any(t == "planner" for t, _ in kinds.values()):
        return None
    out = {}
    for name, (ctype, sub) in kinds.items():
        replicas = _map(services[name]).get("replicas", 1)
        if (ctype in WORKER_LIKE or sub in WORKER_LIKE) and isinstance(replicas, int) and not isinstance(replicas, bool):
            out[name] = replicas
    return out


@dataclass
class StandInPlanner:
    period_s: float
    targets: dict[str, dict[str, int]] = field(default_factory=dict)  # dgd -> what it keeps
    next_at: float | None = None

    def step(self, dgds: Sequence[Mapping[str, Any]], adapters: Sequence[Mapping[str, Any]], now: float) -> PlannerWrites:
        """The writes due at ``now`` (nothing between periods); v1alpha1 DGDs, v1beta1 adapters."""
        out = PlannerWrites()
        for dgd in dgds:
            name = str(_map(dgd.get("metadata")).get("name"))
            workers = _workers(dgd)
            if workers is not None and name not in self.targets:
                self.targets[name] = dict(workers)
        if self.next_at is None:
            self.next_at = now + self.period_s
            return out
        if now < self.next_at:
            return out
        self.next_at = now + self.period_s
        adapter_spec = {str(_map(a.get("metadata")).get("name")): _map(a.get("spec")).get("replicas") for a in adapters}
        for dgd in dgds:
            name = str(_map(dgd.get("metadata")).get("name"))
            current, keep = _workers(dgd) or {}, self.targets.get(name, {})
            adapted = enabled_components(dgd)
            for comp, want in keep.items():
                if comp in adapted:
                    if adapter_spec.get(adapter_name(name, comp)) != want:
                        out.adapter_replicas[adapter_name(name, comp)] = want
                elif comp in current and current[comp] != want:
                    out.dgd_replicas.setdefault(name, {})[comp] = want
        return out
