"""One period of the live guard for one group (pure; the task does the I/O: tasks/power.py).

Inputs: the group's nodes and the priority of their pods (``GroupView``), the agents' last
reports of those nodes (``power.telemetry``), what the guard remembers from its previous
period (``GuardMemory``) and the time. Output: the guard's decision, one ``Overlay`` per node
(throttle caps plus every GPU's safe cap) and the memory for the next period.

The memory is the group's GPU inventory: every GPU the guard has seen holding a pod stays
counted until its node reports it idle or the node leaves the group. A GPU whose node stops
reporting (agent, node or Redis gone), whose report goes missing or carries no draw, or whose
draw is implausible (power/sensors.py: below a floor, or stuck while the group's load moves)
is *lost*: counted at the larger of its safe cap and the limit it last reported enforced (a dead
agent leaves NVML at that limit), sent its safe cap, and never a source of room for the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from powerfleet.power.guard import GroupRefused, GuardDecision, GuardSettings, GuardState, GpuReading, Priority, decide
from powerfleet.power.overlay import GRACE, Overlay, by_node
from powerfleet.power.safe import GpuRange, refusal, safe_caps
from powerfleet.power.sensors import Fault, Track, check
from powerfleet.power.telemetry import GpuTelemetry


@dataclass(frozen=True)
class GroupView:
    """The group's nodes and the priority of the pods on them (pod UID -> priority)."""

    nodes: frozenset[str]
    priority: Mapping[str, Priority] = field(default_factory=dict)
    default_priority: Priority = "high"
    gpus: Mapping[str, int] = field(default_factory=dict)  # node -> its allocatable GPUs, where the kubelet says


@dataclass(frozen=True)
class KnownGpu:
    node: str
    priority: Priority
    cap_w: float
    min_w: float
    max_w: float
    at: float  # the time of its last report
    enforced_w: float | None = None  # the limit it last reported enforced


@dataclass(frozen=True)
class GuardMemory:
    revision: int = 0
    state: GuardState = field(default_factory=GuardState)
    gpus: Mapping[str, KnownGpu] = field(default_factory=dict)
    issued_at: float | None = None  # when the guard last sent overlays (its clock)
    tracks: Mapping[str, Track] = field(default_factory=dict)  # the sensor check's memory (power/sensors.py)
    epoch: str = ""  # set when the memory starts (power/authority.py): an agent accepts overlays of it only

    def to_json(self) -> dict[str, Any]:
        return {"revision": self.revision, "epoch": self.epoch, "mode": self.state.mode, "throttle": dict(self.state.throttle),
                "gpus": {g: vars(k) for g, k in sorted(self.gpus.items())}, "issued_at": self.issued_at,
                "tracks": {g: vars(t) for g, t in sorted(self.tracks.items())}}

    @classmethod
    def from_json(cls, data: Any) -> GuardMemory:
        """What was stored; anything unreadable starts afresh (the guard then sees no throttle, and
        the agents' caps in force stay until its first decision reaches them)."""
        try:
            gpus = {str(g): KnownGpu(node=str(k["node"]), priority="low" if k["priority"] == "low" else "high",
                                     cap_w=float(k["cap_w"]), min_w=float(k["min_w"]), max_w=float(k["max_w"]),
                                     at=float(k["at"]), enforced_w=_opt(k.get("enforced_w")))
                    for g, k in data["gpus"].items()}
            tracks = {str(g): Track.from_json(t) for g, t in (data.get("tracks") or {}).items()}
            throttle = {str(g): float(w) for g, w in data["throttle"].items() if math.isfinite(float(w))}
            mode = data["mode"] if data["mode"] in ("release", "hold", "throttle_low", "throttle_all") else "hold"
            issued = data.get("issued_at")
            return cls(revision=int(data["revision"]), state=GuardState(throttle=throttle, mode=mode), gpus=gpus,
                       issued_at=_opt(issued), tracks=tracks, epoch=str(data.get("epoch") or ""))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):  # int(Infinity): OverflowError
            return cls()


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True)
class GuardPeriod:
    decision: GuardDecision | None  # None: refused
    overlays: dict[str, Overlay]
    memory: GuardMemory
    refused: str | None = None
    over_limit: bool = False  # the group's measured draw is above its limit this period
    faults: Mapping[str, Fault | str] = field(default_factory=dict)  # lost GPUs: unreadable | zero | stuck | silent


def _priority(view: GroupView, t: GpuTelemetry) -> Priority:
    """A GPU shared by pods of different priorities takes the lowest."""
    prios = {view.priority[u] for u in t.pod_uids or (t.pod_uid,) if u in view.priority}
    return "low" if "low" in prios else ("high" if prios else view.default_priority)


def known_gpus(view: GroupView, telemetry: Mapping[str, list[GpuTelemetry]],
               memory: GuardMemory) -> dict[str, tuple[KnownGpu, float | None, bool]]:
    """GPU -> (what the guard knows of it, its reported draw, whether its node reported it this period).
    The inventory is the memory plus this period's reports: a GPU leaves it only when its node
    reports it idle, or the node leaves the group."""
    out: dict[str, tuple[KnownGpu, float | None, bool]] = {}
    for node in sorted(view.nodes):
        seen = set()
        for t in telemetry.get(node) or ():
            seen.add(t.gpu)
            if not t.idle:
                k = KnownGpu(node, _priority(view, t), t.cap_w, t.min_w, t.max_w, t.at, t.enforced_w)
                out[t.gpu] = (k, t.draw_w, True)
        for gpu, k in memory.gpus.items():
            if k.node == node and gpu not in seen:  # silent node, or a report without it: still counted
                out[gpu] = (k, None, False)
    return out


def unseen_gpus(view: GroupView, telemetry: Mapping[str, list[GpuTelemetry]],
                known: Mapping[str, tuple[KnownGpu, float | None, bool]],
                unseen_w: float) -> dict[str, tuple[KnownGpu, float | None, bool]]:
    """The GPUs a node has (its allocatable count) that no report names, neither now nor before (an
    agent that never reported, a GPU NVML does not list): each counted as lost at ``unseen_w``, the
    card's limit, since nothing lowers it."""
    out: dict[str, tuple[KnownGpu, float | None, bool]] = {}
    for node in sorted(view.nodes):
        named = {t.gpu for t in telemetry.get(node) or ()} | {g for g, (k, _, _) in known.items() if k.node == node}
        for i in range(max(0, view.gpus.get(node, 0) - len(named))):
            out[f"unseen:{node}:{i}"] = (KnownGpu(node, "high", unseen_w, 0.0, unseen_w, -math.inf, unseen_w),
                                         None, False)
    return out


def guard_period(settings: GuardSettings, group: str, limit_w: float, view: GroupView,
                 telemetry: Mapping[str, list[GpuTelemetry]], memory: GuardMemory, now: float) -> GuardPeriod:
    known = known_gpus(view, telemetry, memory)
    faults: dict[str, Fault | str] = {}
    sensed, tracks = check({g: draw for g, (_, draw, reported) in known.items() if reported},
                           {g: k.enforced_w for g, (k, _, _) in known.items()}, memory.tracks, now,
                           settings.floor_w, settings.stuck_s, settings.stuck_load_w)
    faults.update(sensed)
    faults.update({g: "silent" for g, (_, _, reported) in known.items() if not reported})
    unseen = unseen_gpus(view, telemetry, known, settings.unseen_w)
    faults.update({g: "unseen" for g in unseen})
    readings = [GpuReading(gpu=g, priority=k.priority, cap_w=k.cap_w, min_w=k.min_w, max_w=k.max_w,
                           draw_w=None if g in faults else draw, at=k.at,
                           enforced_w=k.enforced_w if k.enforced_w is not None else max(k.cap_w, k.max_w))
                for g, (k, draw, _) in sorted({**known, **unseen}.items())]
    gpus = {g: k for g, (k, _, _) in known.items()}
    state = GuardState(throttle={g: w for g, w in memory.state.throttle.items() if g in gpus},
                       mode=memory.state.mode)
    if not readings:
        return GuardPeriod(None, {}, GuardMemory(memory.revision, state, gpus, epoch=memory.epoch))
    ranges = {r.gpu: r.range() for r in readings}
    lapsed = memory.issued_at is not None and now - memory.issued_at > settings.period_s * (1.0 + GRACE)
    if lapsed and refusal(group, ranges, limit_w) is None:
        # The guard was away long enough for every agent to fall back: resume from the safe caps
        # in force and release stepwise from there, never straight back to what it sent last.
        safe = safe_caps(ranges, limit_w)
        state = GuardState(throttle={g: w for g, w in safe.items() if w < ranges[g].top_w}, mode="hold")
    try:
        d = decide(settings, group, limit_w, readings, state, now)
    except GroupRefused as exc:
        return GuardPeriod(None, {}, GuardMemory(memory.revision, state, gpus, tracks=tracks, epoch=memory.epoch),
                           refused=str(exc))
    # Monotonic across a lost memory too (Redis restarted empty): an agent ignores an overlay older
    # than the one it holds, so a revision that started again at 1 would keep it in fallback.
    revision = max(memory.revision + 1, int(now * 1000))
    epoch = memory.epoch or f"{int(now * 1000):x}"  # a memory that starts (or starts again) starts an epoch
    overlays = by_node(d, {g: k.node for g, k in gpus.items()}, group, settings.period_s, revision, now, epoch)
    # (an unseen GPU has no UUID to send anything to: it is in the figures, not in the overlays)
    return GuardPeriod(d, overlays, GuardMemory(revision, d.state, gpus, issued_at=now, tracks=tracks, epoch=epoch),
                       over_limit=d.measured_w > limit_w, faults=faults)
