"""One period of the live guard for one group (pure; the task does the I/O: tasks/power.py).

Inputs: the group's nodes and the priority of their pods (``GroupView``), the agents' last
reports of those nodes (``power.telemetry``), what the guard remembers from its previous
period (``GuardMemory``) and the time. Output: the guard's decision, one ``Overlay`` per node
(throttle caps plus every GPU's safe cap) and the memory for the next period.

The memory matters for the fallback's arithmetic: a GPU whose node stops reporting (agent,
node or Redis gone) is still counted, at its safe cap, which its agent enforces on its own once
the overlays stop. A GPU is forgotten only when its node reports again without it (no pod on
it any more) or its node leaves the group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from powerfleet.power.guard import GroupRefused, GuardDecision, GuardSettings, GuardState, GpuReading, Priority, decide
from powerfleet.power.overlay import GRACE, Overlay, by_node
from powerfleet.power.safe import GpuRange, refusal, safe_caps
from powerfleet.power.telemetry import GpuTelemetry


@dataclass(frozen=True)
class GroupView:
    """The group's nodes and the priority of the pods on them (pod UID -> priority)."""

    nodes: frozenset[str]
    priority: Mapping[str, Priority] = field(default_factory=dict)
    default_priority: Priority = "high"


@dataclass(frozen=True)
class KnownGpu:
    node: str
    priority: Priority
    cap_w: float
    min_w: float
    max_w: float
    at: float  # the time of its last report


@dataclass(frozen=True)
class GuardMemory:
    revision: int = 0
    state: GuardState = field(default_factory=GuardState)
    gpus: Mapping[str, KnownGpu] = field(default_factory=dict)
    issued_at: float | None = None  # when the guard last sent overlays (its clock)

    def to_json(self) -> dict[str, Any]:
        return {"revision": self.revision, "mode": self.state.mode, "throttle": dict(self.state.throttle),
                "gpus": {g: vars(k) for g, k in sorted(self.gpus.items())}, "issued_at": self.issued_at}

    @classmethod
    def from_json(cls, data: Any) -> GuardMemory:
        """What was stored; anything unreadable starts afresh (the guard then sees no throttle, and
        the agents' caps in force stay until its first decision reaches them)."""
        try:
            gpus = {str(g): KnownGpu(node=str(k["node"]), priority="low" if k["priority"] == "low" else "high",
                                     cap_w=float(k["cap_w"]), min_w=float(k["min_w"]), max_w=float(k["max_w"]),
                                     at=float(k["at"])) for g, k in data["gpus"].items()}
            throttle = {str(g): float(w) for g, w in data["throttle"].items() if math.isfinite(float(w))}
            mode = data["mode"] if data["mode"] in ("release", "hold", "throttle_low", "throttle_all") else "hold"
            issued = data.get("issued_at")
            return cls(revision=int(data["revision"]), state=GuardState(throttle=throttle, mode=mode), gpus=gpus,
                       issued_at=None if issued is None else float(issued))
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls()


@dataclass(frozen=True)
class GuardPeriod:
    decision: GuardDecision | None  # None: refused
    overlays: dict[str, Overlay]
    memory: GuardMemory
    refused: str | None = None
    over_limit: bool = False  # the group's measured draw is above its limit this period


def known_gpus(view: GroupView, telemetry: Mapping[str, list[GpuTelemetry]],
               memory: GuardMemory) -> dict[str, tuple[KnownGpu, float | None]]:
    """GPU -> (what the guard knows of it, its draw; None where its node does not report)."""
    out: dict[str, tuple[KnownGpu, float | None]] = {}
    for node in sorted(view.nodes):
        reports = telemetry.get(node)
        if reports:
            for t in reports:
                prio = view.priority.get(t.pod_uid, view.default_priority)
                out[t.gpu] = (KnownGpu(node, prio, t.cap_w, t.min_w, t.max_w, t.at), t.draw_w)
        else:  # the node is silent: keep counting its GPUs (at their safe caps)
            for gpu, k in memory.gpus.items():
                if k.node == node:
                    out[gpu] = (k, None)
    return out


def guard_period(settings: GuardSettings, group: str, limit_w: float, view: GroupView,
                 telemetry: Mapping[str, list[GpuTelemetry]], memory: GuardMemory, now: float) -> GuardPeriod:
    known = known_gpus(view, telemetry, memory)
    readings = [GpuReading(gpu=g, priority=k.priority, cap_w=k.cap_w, min_w=k.min_w, max_w=k.max_w, draw_w=draw,
                           at=k.at) for g, (k, draw) in sorted(known.items())]
    gpus = {g: k for g, (k, _) in known.items()}
    state = GuardState(throttle={g: w for g, w in memory.state.throttle.items() if g in gpus},
                       mode=memory.state.mode)
    if not readings:
        return GuardPeriod(None, {}, GuardMemory(memory.revision, state, gpus))
    ranges = {g: GpuRange(k.cap_w, k.min_w, k.max_w) for g, k in gpus.items()}
    lapsed = memory.issued_at is not None and now - memory.issued_at > settings.period_s * (1.0 + GRACE)
    if lapsed and refusal(group, ranges, limit_w) is None:
        # The guard was away long enough for every agent to fall back: resume from the safe caps
        # in force and release stepwise from there, never straight back to what it sent last.
        safe = safe_caps(ranges, limit_w)
        state = GuardState(throttle={g: w for g, w in safe.items() if w < ranges[g].top_w}, mode="hold")
    try:
        d = decide(settings, group, limit_w, readings, state, now)
    except GroupRefused as exc:
        return GuardPeriod(None, {}, GuardMemory(memory.revision, state, gpus), refused=str(exc))
    # Monotonic across a lost memory too (Redis restarted empty): an agent ignores an overlay older
    # than the one it holds, so a revision that started again at 1 would keep it in fallback.
    revision = max(memory.revision + 1, int(now * 1000))
    overlays = by_node(d, {g: k.node for g, k in gpus.items()}, group, settings.period_s, revision, now)
    return GuardPeriod(d, overlays, GuardMemory(revision, d.state, gpus, issued_at=now),
                       over_limit=d.measured_w > limit_w)
