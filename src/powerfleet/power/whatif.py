"""What-if: a trace replayed on N workers of one oversubscribed group under the guard.

Two deployments share the group: a low-priority one (``priority_split`` of the workers and
of the traffic) and a
high-priority one, each with its own KV router. Simulated time advances in 1-second bins:

* each bin, every worker's GPUs draw what their steps demand under the caps in force
  (``sim.power.PoweredSimulation``); the group's measured draw is the sum;
* at each guard tick (every ``period_s`` seconds, at a bin's end) the guard reads the
  1-second averages and decides; its caps take effect ``actuation_s`` later (the overlay's
  trip to the agent and NVML's enforcement);
* a group whose requested caps fit its limit is not guarded (nothing to throttle);
* during a telemetry loss (``telemetry_loss``: the guard, beat or Redis gone) no overlay
  arrives: every agent moves its GPUs to their safe caps once the last overlay it got is
  no longer fresh (``power.overlay.agent_cap``: 1.5 periods after it), and holds them; at
  the first tick after the loss the guard resumes from the safe caps and releases stepwise;
* faults (``faults``, power/faults.py) change what some GPUs report or whether their agent
  follows the guard; readings of a faulted GPU pass the live guard's sensor check
  (power/sensors.py). Only those: the simulator's readings are exact (an idle GPU reads 70 W to
  the milliwatt, which no real sensor does), so checking every GPU would take steady ones for
  stuck.

Deterministic: no wall clock; the guard runs on a ``FakeClock`` set to simulated time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from powerfleet.clock import FakeClock
from powerfleet.power.faults import AGENT_KINDS, SENSOR_KINDS, FaultSpec, check_gpus, check_span
from powerfleet.power.guard import Guard, GuardSettings, GpuReading
from powerfleet.power.overlay import GRACE
from powerfleet.power.safe import GpuRange, refusal, safe_caps
from powerfleet.power.sensors import Track, check
from powerfleet.sim.engine import EngineResult
from powerfleet.sim.policy import SLA, RouterPolicy
from powerfleet.sim.power import BIN_MS, CardPower, PoweredSimulation
from powerfleet.sim.profile import TimingProfile, default_profile
from powerfleet.sim.replay import Arrivals, start_simulation

PRIORITIES = ("high", "low")
_GOLDEN = 0.6180339887498949  # session keys spread evenly over [0, 1)


class WhatIfConfig(BaseModel):
    """The what-if's inputs (CLI options), validated; errors name the field."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    workers: int = Field(ge=1, le=4096)
    gpus_per_worker: int = Field(ge=1, le=64)
    cap_w: float = Field(gt=0, description="cap each GPU's pod requests, W")
    limit_w: float = Field(gt=0, description="the group's limit, W")
    load_scale: float = Field(1.0, gt=0, le=100, description="arrival rate x S")
    priority_split: float = Field(0.5, ge=0, le=1, description="share of workers and traffic at low priority")
    sla: SLA | None = None
    telemetry_loss: tuple[float, float] | None = None  # simulated seconds [A, B)
    actuation_s: float = Field(0.5, ge=0, lt=1, description="from a tick to the new caps binding, s")
    guard: GuardSettings = GuardSettings()
    seed: int = Field(0, ge=0)
    faults: tuple[FaultSpec, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> WhatIfConfig:
        if self.telemetry_loss is not None:
            a, b = self.telemetry_loss
            if not (0 <= a < b):
                raise ValueError(f"telemetry loss must be A:B seconds with 0 <= A < B, got {a}:{b}")
        if self.guard.period_s != int(self.guard.period_s):
            raise ValueError(f"the what-if's guard period must be a whole number of seconds, got {self.guard.period_s}")
        if 0 < self.priority_split < 1 and self.workers < 2:
            raise ValueError("a priority split between 0 and 1 needs at least 2 workers")
        return self

    def split_workers(self) -> dict[str, int]:
        low = round(self.priority_split * self.workers)
        if self.priority_split > 0:
            low = max(low, 1)
        if self.priority_split < 1:
            low = min(low, self.workers - 1)
        return {"high": self.workers - low, "low": low}


@dataclass
class Deployment:
    """One priority class: its share of the traffic replayed on its own workers."""

    priority: str
    arrivals: Arrivals
    workers: int
    first_gpu: int  # index of its first GPU in the group
    power: PoweredSimulation | None = None


@dataclass
class Timeline:
    """What the run recorded, per 1-second bin and per GPU (for the report)."""

    group_w: list[float] = field(default_factory=list)
    capped_ms: dict[str, float] = field(default_factory=dict)  # priority -> GPU-ms below the request
    capping_events: dict[str, int] = field(default_factory=dict)  # priority -> GPU transitions into a cap
    throttle_events: dict[str, int] = field(default_factory=dict)  # priority -> caps lowered by the guard
    modes: dict[str, int] = field(default_factory=dict)  # guard mode -> periods
    fallback_activations: int = 0
    fallback_reactions_s: list[float] = field(default_factory=list)
    duration_s: float = 0.0


@dataclass
class WhatIfRun:
    config: WhatIfConfig
    deployments: list[Deployment]
    results: dict[str, EngineResult]
    timeline: Timeline
    requested_w: float
    profile: str
    guarded: bool


def split_key(index: int) -> float:
    """Where request ``index`` falls in [0, 1): a low-discrepancy sequence, so that any share
    of consecutive requests is split in the same proportion. (Not by conversation: the
    traces' first prompt block is shared by every conversation.)"""
    return (index * _GOLDEN) % 1.0


def split(arr: Arrivals, low_share: float) -> dict[str, Arrivals]:
    """The prepared arrivals cut into the low- and high-priority deployments' traffic."""
    idx: dict[str, list[int]] = {"high": [], "low": []}
    for i in range(len(arr.arrival_ms)):
        idx["low" if split_key(i) < low_share else "high"].append(i)
    out = {}
    for prio, ks in idx.items():
        out[prio] = Arrivals(
            arrival_ms=[arr.arrival_ms[k] for k in ks], isl=[arr.isl[k] for k in ks], osl=[arr.osl[k] for k in ks],
            hashes=[arr.hashes[k] for k in ks], window_ms=arr.window_ms,
            scored=None if arr.scored is None else tuple(arr.scored[k] for k in ks),
        )
    return out


def _busy(dep: Deployment) -> bool:
    sim = dep.power.sim if dep.power else None
    return sim is not None and (bool(sim.heap) or sim.i < len(sim.arrivals))


def run_whatif(arr: Arrivals, cfg: WhatIfConfig, *, policy: RouterPolicy | None = None,
               profile: TimingProfile | None = None, card: CardPower | None = None) -> WhatIfRun:
    """Replay ``arr`` (prepared: window and load scale applied) under the guard; deterministic.
    Raises ``ValueError`` in one line for a group the guard cannot protect."""
    profile = profile or default_profile()
    card = card or CardPower()
    if not card.min_w <= cfg.cap_w <= card.tdp_w:
        raise ValueError(f"cap must be within the card's range {card.min_w:g}-{card.tdp_w:g} W, got {cfg.cap_w:g}")
    g = cfg.gpus_per_worker
    n_gpus = cfg.workers * g
    ranges = {f"gpu{k}": GpuRange(cfg.cap_w, card.min_w, card.tdp_w) for k in range(n_gpus)}
    why = refusal("what-if", ranges, cfg.limit_w)
    if why is not None:
        raise ValueError(why)
    check_gpus(cfg.faults, n_gpus)
    safe = safe_caps(ranges, cfg.limit_w)
    counts = cfg.split_workers()
    parts = split(arr, cfg.priority_split)
    deps: list[Deployment] = []
    first = 0
    for prio in PRIORITIES:
        dep = Deployment(prio, parts[prio], counts[prio], first)
        first += counts[prio] * g
        if dep.workers:
            sim = start_simulation(dep.arrivals, dep.workers, policy or RouterPolicy(), cfg.seed, profile=profile)
            dep.power = PoweredSimulation(sim, card, cap_w=cfg.cap_w)
        deps.append(dep)
    prio_of = {f"gpu{k}": d.priority for d in deps for k in range(d.first_gpu, d.first_gpu + d.workers * g)}
    loop = _Loop(cfg, deps, card, ranges, safe, prio_of)
    loop.run(arr.window_ms)
    check_span(cfg.faults, cfg.telemetry_loss, loop.tl.duration_s)
    results = {d.priority: d.power.sim.result() for d in deps if d.power is not None}
    return WhatIfRun(cfg, deps, results, loop.tl, n_gpus * cfg.cap_w, profile.name, loop.guarded)


@dataclass
class _Pending:
    caps: dict[str, float]
    at_ms: float  # when they bind


class _Loop:
    """The bins and the guard's ticks of one what-if run."""

    def __init__(self, cfg: WhatIfConfig, deps: list[Deployment], card: CardPower, ranges: dict[str, GpuRange],
                 safe: dict[str, float], prio_of: dict[str, str]) -> None:
        self.cfg, self.deps, self.card, self.ranges, self.safe, self.prio_of = cfg, deps, card, ranges, safe, prio_of
        self.clock = FakeClock(t=0.0)
        self.guard = Guard("what-if", cfg.limit_w, cfg.guard, clock=self.clock)
        self.tl = Timeline(capped_ms={p: 0.0 for p in PRIORITIES}, capping_events={p: 0 for p in PRIORITIES},
                           throttle_events={p: 0 for p in PRIORITIES})
        self.caps = {k: cfg.cap_w for k in ranges}  # cap in force per GPU
        self.pending: _Pending | None = None
        self.period = int(cfg.guard.period_s)
        self.in_fallback = False
        self.last_overlay_s = 0.0  # the guard ran before the replay began
        self.tracks: dict[str, Track] = {}  # the sensor check's memory (faulted GPUs only)
        self.reported: dict[str, tuple[float | None, float]] = {}  # GPU -> its last report (draw, at)
        self.restarted: set[int] = set()  # agent-restart faults already applied
        # not oversubscribed (the requests fit the limit): no guard, as with the ratio 1.0 default
        self.guarded = len(ranges) * cfg.cap_w > cfg.limit_w

    def run(self, end_ms: float) -> None:
        s = 0
        while s * BIN_MS < end_ms or any(_busy(d) for d in self.deps):
            self.bin(s * BIN_MS, (s + 1) * BIN_MS)
            s += 1
            if self.guarded and s % self.period == 0:
                self.tick(s)
        self.tl.duration_s = float(s)

    def bin(self, t0: float, t1: float) -> None:
        cap_w = self.cfg.cap_w
        switch = t1
        old = self.caps
        if self.pending is not None and self.pending.at_ms < t1:
            switch = max(self.pending.at_ms, t0)
            _run(self.deps, switch)
            new = self.pending.caps
            for k, c in new.items():
                if c < cap_w <= old[k] + 1e-9:
                    self.tl.capping_events[self.prio_of[k]] += 1
            self.caps = new
            _apply(self.deps, new, self.cfg.gpus_per_worker, switch)
            self.pending = None
        for k, c in self.caps.items():
            below = (switch - t0) * (old[k] < cap_w - 1e-9) + (t1 - switch) * (c < cap_w - 1e-9)
            self.tl.capped_ms[self.prio_of[k]] += below
        _run(self.deps, t1)
        self.per_gpu = _draws(self.deps, self.cfg.gpus_per_worker, t0, t1)
        self.tl.group_w.append(math.fsum(self.per_gpu.values()))

    def tick(self, s: int) -> None:
        cfg, tl = self.cfg, self.tl
        self.clock.t = self.clock.mono = float(s)
        loss = cfg.telemetry_loss
        if loss is not None and loss[0] <= s < loss[1]:
            # no overlay comes: each agent falls back when the last one it got is no longer
            # fresh (power.overlay.agent_cap), and holds the safe caps
            tl.modes["fallback"] = tl.modes.get("fallback", 0) + 1
            if not self.in_fallback:
                self.in_fallback = True
                bind_s = self.last_overlay_s + cfg.guard.period_s * (1.0 + GRACE)
                self.pending = _Pending(dict(self.safe), bind_s * 1000.0)
                tl.fallback_activations += cfg.workers
                tl.fallback_reactions_s.append(bind_s - loss[0])
            return
        self.last_overlay_s = float(s)
        if self.in_fallback:
            self.in_fallback = False
            self.guard.resume({k: c for k, c in self.caps.items() if c < self.ranges[k].top_w})
        kind_of = {f"gpu{i}": f.kind for f in cfg.faults if f.active(float(s)) for i in f.gpus}
        readings = [GpuReading(k, self.prio_of[k], cfg.cap_w, self.card.min_w, self.card.tdp_w,  # type: ignore[arg-type]
                               draw, at, enforced_w=self.caps[k]) for k, (draw, at) in self.read(kind_of, s).items()]
        d = self.guard.tick(readings)
        tl.modes[d.mode] = tl.modes.get(d.mode, 0) + 1
        for e in d.events:
            tl.throttle_events[e.priority] += 1
        new = dict(d.in_force)
        for i, f in enumerate(cfg.faults):
            if f.kind in AGENT_KINDS and f.active(float(s)):
                for k in (f"gpu{j}" for j in f.gpus):  # dead: NVML keeps its limit; restarted: its safe caps
                    new[k] = self.caps[k] if f.kind == "agent-dead" else min(self.safe[k], cfg.cap_w)
                if f.kind == "agent-restart" and i not in self.restarted:
                    self.restarted.add(i)
                    tl.fallback_activations += 1
                    tl.fallback_reactions_s.append(s + cfg.actuation_s - f.start_s)
        if new != self.caps:
            self.pending = _Pending(new, (s + cfg.actuation_s) * 1000.0)

    def read(self, kind_of: dict[str, str], s: int) -> dict[str, tuple[float | None, float]]:
        """What the guard reads of each GPU at tick ``s``: (draw or None, when it was measured)."""
        now, gs = float(s), self.cfg.guard
        out: dict[str, tuple[float | None, float]] = {}
        for k in self.ranges:
            kind = kind_of.get(k)
            if kind in AGENT_KINDS:  # no report: the last one lingers
                out[k] = self.reported.get(k, (self.per_gpu[k], now))
                continue
            draw: float | None = self.per_gpu[k]
            if kind == "unreadable":
                draw = None
            elif kind == "zero":
                draw = 0.0
            elif kind == "stuck":
                draw = self.tracks[k].draw_w if k in self.tracks else self.reported.get(k, (draw, now))[0]
            out[k] = self.reported[k] = (draw, now)
        live = {k: out[k][0] for k in out if kind_of.get(k) not in AGENT_KINDS}
        sensed, tracks = check(live, self.caps, self.tracks, now, gs.floor_w, gs.stuck_s, gs.stuck_load_w)
        self.tracks = {k: t for k, t in tracks.items() if kind_of.get(k) == "stuck"}
        lost = {k for k in sensed if kind_of.get(k) in SENSOR_KINDS}  # the faulted GPUs' readings only
        return {k: ((None, at) if k in lost else (draw, at)) for k, (draw, at) in out.items()}


def _run(deps: Sequence[Deployment], until_ms: float) -> None:
    for d in deps:
        if d.power is not None:
            d.power.run(until_ms)


def _apply(deps: Sequence[Deployment], caps: dict[str, float], g: int, t_ms: float) -> None:
    """A worker runs at the lowest cap among its GPUs (tensor parallel: one step for all)."""
    for d in deps:
        if d.power is None:
            continue
        for w in range(d.workers):
            base = d.first_gpu + w * g
            d.power.set_cap(w, min(caps[f"gpu{base + j}"] for j in range(g)), t_ms)


def _draws(deps: Sequence[Deployment], g: int, t0: float, t1: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in deps:
        if d.power is None:
            continue
        for w, watts in enumerate(d.power.draw(t0, t1)):
            base = d.first_gpu + w * g
            for j in range(g):
                out[f"gpu{base + j}"] = watts
    return out
