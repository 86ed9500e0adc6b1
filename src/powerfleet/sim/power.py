"""Per-GPU power over time from the replay's engine activity (docs/power.md).

Each step the engine forms is given a demand in W per GPU from what it does:

* prefill is compute-bound: a chunk of 512 new tokens or more draws the card's limit
  (Splitwise's A100 peak reaches 1.0-1.09 of TDP from 512 tokens at TP2/TP4); a
  128-token chunk draws 0.58 of it (the middle of Splitwise's 0.46-0.69); linear between;
* decode is memory-bound and draws by batch size, on the logistic shape in log2(batch) of
  G2G / ML.ENERGY, scaled to the H200 decode range of the Illusion paper (137 W at batch 1,
  300 W at batch 128, both at 2k context), and a little more per doubling of the mean
  context (an assumption: no published figure was found for context alone);
* a mixed step draws the time-weighted mix of its prefill and decode parts; an idle worker
  draws the card's idle power (70 W).

A cap below a step's demand slows the step through ``CapCurve`` (its static floor, alpha
per phase and the decode cliff near the minimum limit), with the step's own demand in
place of the curve's fixed one, and the step then draws the cap: draw never exceeds it.

All GPUs of a worker run the same tensor-parallel step, so they draw the same; a worker
runs at the lowest cap among its GPUs. ``PoweredSteps`` wraps the engine's ``StepModel``
(no change to the engine: it replaces ``Simulation.model``) and records, per worker, the
steps as segments ``[start_ms, end_ms, draw_w, capped]``; ``PoweredSimulation`` turns them
into 1-second averages, as NVML's ``power.draw`` reports them, and changes caps over time.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

from powerfleet.sim.batch import DECODE_RUN, MIXED, StepModel, Worker, run_ms
from powerfleet.sim.engine import EngineConfig, Simulation
from powerfleet.sim.policy import SLA, RouterOptions, RouterPolicy
from powerfleet.sim.profile import CapCurve, TimingProfile, default_profile
from powerfleet.sim.replay import Arrivals, start_simulation
from powerfleet.sim.summary import ReplaySummary, summarize

BIN_MS = 1000.0


@dataclass(frozen=True)
class CardPower:
    """What one GPU draws per engine phase (W). Defaults: H200 SXM (docs/power.md)."""

    name: str = "h200-sxm"
    tdp_w: float = 700.0
    min_w: float = 200.0  # minimum settable limit (H100's 200 W; assumed for H200)
    idle_w: float = 70.0
    prefill_tokens: tuple[float, ...] = (0.0, 128.0, 512.0)
    prefill_fraction: tuple[float, ...] = (0.10, 0.58, 1.0)  # of TDP
    decode_low_w: float = 134.4  # logistic floor and span: 137 W at batch 1, 300 W at 128
    decode_span_w: float = 175.7
    decode_mid_log2: float = 4.2
    decode_ref_context: float = 2048.0
    decode_context_gain: float = 0.05  # per doubling of the mean context over 2k (assumption)

    def prefill_w(self, tokens: float) -> float:
        """Draw of a prefill chunk of ``tokens`` new tokens (0 tokens: idle)."""
        if tokens <= 0:
            return self.idle_w
        xs, ys = self.prefill_tokens, self.prefill_fraction
        if tokens >= xs[-1]:
            return ys[-1] * self.tdp_w
        i = 0
        while tokens > xs[i + 1]:
            i += 1
        f = ys[i] + (ys[i + 1] - ys[i]) * (tokens - xs[i]) / (xs[i + 1] - xs[i])
        return max(f * self.tdp_w, self.idle_w)

    def decode_w(self, batch: int, kv_tokens: float) -> float:
        """Draw of a decode step of ``batch`` sequences holding ``kv_tokens`` in all."""
        if batch <= 0:
            return self.idle_w
        base = self.decode_low_w + self.decode_span_w / (1.0 + math.exp(-(math.log2(batch) - self.decode_mid_log2)))
        context = max(kv_tokens / batch, 1.0)
        scale = 1.0 + self.decode_context_gain * math.log2(context / self.decode_ref_context)
        return min(max(base * scale, self.idle_w), self.tdp_w)


def slowdown(curve: CapCurve, cap_fraction: float, demand_fraction: float, alpha: float, *,
             decode: bool = False) -> float:
    """How much longer a phase takes under a cap (fractions of TDP); 1 when the cap is above
    the demand. The decode cliff applies only where the cap binds."""
    if cap_fraction >= demand_fraction:
        return 1.0
    head = cap_fraction - curve.static_floor
    if head <= 0:
        return math.inf
    s = ((demand_fraction - curve.static_floor) / head) ** (1.0 / alpha)
    if decode and cap_fraction < curve.min_limit * 1.1:
        s *= curve.decode_cliff
    return s


class PoweredSteps(StepModel):
    """The engine's step model with a per-worker power cap and a record of each step's draw."""

    __slots__ = ("card", "curve", "caps", "segments")

    card: CardPower
    curve: CapCurve
    caps: list[float]
    segments: list[list[list[Any]]]

    @classmethod
    def wrap(cls, base: StepModel, workers: int, card: CardPower, curve: CapCurve | None = None,
             cap_w: float | None = None) -> PoweredSteps:
        """A copy of ``base`` (same callbacks and limits) that meters power; caps start at ``cap_w``."""
        self = cls.__new__(cls)
        for name in StepModel.__slots__:
            setattr(self, name, getattr(base, name))
        self.card = card
        self.curve = curve or CapCurve()
        self.caps = [card.tdp_w if cap_w is None else cap_w] * workers
        self.segments = [[] for _ in range(workers)]
        return self

    def start(self, w: Worker, t: float) -> bool:
        if not super().start(w, t):
            return False
        card, curve = self.card, self.curve
        cap = self.caps[w.wid]
        tdp = card.tdp_w
        cf = cap / tdp
        nd = len(w.decoding)
        if w.kind == MIXED:
            ptoks = 0
            for _, take in w.chunk:
                ptoks += take
            tp = self.prefill_ms(ptoks) * self.pf
            td = self.decode_ms(nd, w.kv) * self.df if nd else 0.0
            rest = max(w.end - t - tp - td, 0.0)  # KV onboarded from an offload tier
            dp = card.prefill_w(ptoks)
            dd = card.decode_w(nd, w.kv) if nd else 0.0
            tp *= slowdown(curve, cf, dp / tdp, curve.prefill_alpha)
            if nd:
                td *= slowdown(curve, cf, dd / tdp, curve.decode_alpha, decode=True)
            total = tp + td + rest
            w.end = t + total
            drawn = (min(dp, cap) * tp + min(dd, cap) * td + min(card.idle_w, cap) * rest) / total if total > 0 \
                else min(dp, cap)
            capped = dp > cap or dd > cap
        else:
            assert w.kind == DECODE_RUN
            dd = card.decode_w(nd, w.kv + nd * w.k * 0.5)  # the run's mean context
            s = slowdown(curve, cf, dd / tdp, curve.decode_alpha, decode=True)
            if s != 1.0:
                w.a *= s
                w.b *= s
                w.end = t + run_ms(w.a, w.b, w.k)
            drawn = min(dd, cap)
            capped = dd > cap
        self.segments[w.wid].append([t, w.end, drawn, capped])
        return True

    def cut(self, w: Worker, t: float) -> bool:
        if not super().cut(w, t):
            return False
        self.segments[w.wid][-1][1] = w.end
        return True


class PoweredSimulation:
    """A ``Simulation`` whose workers draw power under caps that may change over time.

    ``run(until_ms)`` advances the engine; ``set_cap(wid, cap_w, t_ms)`` changes a worker's
    cap at ``t_ms`` (a decode run in progress ends at its next step boundary and the steps
    after it run under the new cap; a mixed step in progress keeps its speed, and its draw
    is held under the new cap); ``draw(t0_ms, t1_ms)`` is each worker's mean draw per GPU
    over the interval, which must follow the previous one and lie before the time run to.
    """

    def __init__(self, sim: Simulation, card: CardPower | None = None, curve: CapCurve | None = None,
                 cap_w: float | None = None) -> None:
        if sim.model.pf != 1.0 or sim.model.df != 1.0:
            raise ValueError("a metered simulation applies its caps itself: build it at cap fraction 1")
        self.sim = sim
        self.card = card or CardPower()
        n = len(sim.ws)
        self.model = PoweredSteps.wrap(sim.model, n, self.card, curve, cap_w)
        sim.model = self.model  # the hook: the engine calls start/cut/advance on its model
        self.cap_changes: list[list[tuple[float, float]]] = [[(-math.inf, c)] for c in self.model.caps]
        self.capped_ms = [0.0] * n

    def run(self, until_ms: float | None = None) -> None:
        self.sim.run(until=until_ms)

    def set_cap(self, wid: int, cap_w: float, t_ms: float) -> None:
        model = self.model
        if model.caps[wid] == cap_w:
            return
        model.caps[wid] = cap_w
        self.cap_changes[wid].append((t_ms, cap_w))
        sim = self.sim
        w = sim.ws[wid]
        if model.cut(w, t_ms):
            sim.seq += 1
            heapq.heappush(sim.heap, (w.end, sim.seq, wid, w.gen))

    def draw(self, t0: float, t1: float) -> list[float]:
        return [self._bin(wid, t0, t1) for wid in range(len(self.model.caps))]

    def _bin(self, wid: int, t0: float, t1: float) -> float:
        segs = self.model.segments[wid]
        caps = self.cap_changes[wid]
        while len(caps) > 1 and caps[1][0] <= t0:
            caps.pop(0)
        energy = 0.0
        busy = 0.0
        keep = 0
        for k, (a, b, drawn, capped) in enumerate(segs):
            if b <= t0:
                keep = k + 1
                continue
            if a >= t1:
                break
            lo = a if a > t0 else t0
            hi = b if b < t1 else t1
            if hi <= lo:
                continue
            energy += _under_caps(caps, lo, hi, drawn)
            busy += hi - lo
            if capped:
                self.capped_ms[wid] += hi - lo
        if keep:
            del segs[:keep]
        # idle draw is below every settable cap (the card's minimum limit is far above it)
        return (energy + (t1 - t0 - busy) * self.card.idle_w) / (t1 - t0)


def _under_caps(caps: list[tuple[float, float]], lo: float, hi: float, drawn: float) -> float:
    """Energy (W ms) of ``drawn`` over [lo, hi) held under the piecewise-constant caps."""
    if len(caps) == 1:
        return (hi - lo) * min(drawn, caps[0][1])
    energy = 0.0
    for j, (t, c) in enumerate(caps):
        nxt = caps[j + 1][0] if j + 1 < len(caps) else math.inf
        a, b = max(lo, t), min(hi, nxt)
        if b > a:
            energy += (b - a) * min(drawn, c)
    return energy


@dataclass(frozen=True)
class PowerTrace:
    """Per-worker mean draw per GPU (W) in 1-second bins from ``start_s``; a worker's GPUs
    draw alike. ``capped_s``: GPU-seconds per worker during which the cap bound."""

    start_s: float
    draw_w: list[list[float]]  # [second][worker]
    capped_s: list[float]
    gpus_per_worker: int

    def group_w(self) -> list[float]:
        """Summed draw of every GPU, per second."""
        g = self.gpus_per_worker
        return [sum(row) * g for row in self.draw_w]


def replay_power(arr: Arrivals, workers: int, policy: RouterPolicy | None = None, seed: int = 0, *,
                 profile: TimingProfile | None = None, engine: EngineConfig | None = None,
                 router: RouterOptions | None = None, sla: SLA | None = None, card: CardPower | None = None,
                 cap_w: float | None = None, curve: CapCurve | None = None) -> tuple[ReplaySummary, PowerTrace]:
    """Replay prepared arrivals with every GPU capped at ``cap_w`` (default: the card's
    limit) and meter their power; the summary is ``replay_arrivals``' (its cap fraction
    field reports the cap as a fraction of the card's limit)."""
    profile = profile or default_profile()
    policy = policy or RouterPolicy()
    card = card or CardPower()
    cap = card.tdp_w if cap_w is None else cap_w
    if not (math.isfinite(cap) and card.min_w <= cap <= card.tdp_w):
        raise ValueError(f"cap must be within the card's range {card.min_w:g}-{card.tdp_w:g} W, got {cap}")
    sim = start_simulation(arr, workers, policy, seed, profile=profile, engine=engine, router=router)
    ps = PoweredSimulation(sim, card, curve, cap)
    ps.run()
    t0 = math.floor(min(arr.arrival_ms, default=0.0) / BIN_MS) * BIN_MS
    t_end = max((segs[-1][1] for segs in ps.model.segments if segs), default=t0)
    rows = []
    t = t0
    while t < t_end:
        rows.append(ps.draw(t, t + BIN_MS))
        t += BIN_MS
    summary = summarize(sim.result(), arr.osl, workers=workers, gpus_per_worker=profile.gpus_per_replica,
                        window_ms=arr.window_ms, sla=sla, policy=policy, seed=seed, profile=profile.name,
                        cap_fraction=cap / card.tdp_w, scored=arr.scored)
    trace = PowerTrace(t0 / 1000.0, rows, [ms / 1000.0 * profile.gpus_per_replica for ms in ps.capped_ms],
                       profile.gpus_per_replica)
    return summary, trace
