"""Replay a trace over N workers under one router policy.

Determinism and common random numbers (CRN): everything is a function of the inputs and
``seed``. Two independent streams are derived from the seed:

* the *arrival* stream (``numpy`` PCG64 seeded with ``[seed, 0]``) draws one jitter per
  request, in trace order, before any routing happens; it does not depend on the policy,
  so every candidate of a sweep sees exactly the same arrival times;
* the *router* stream (``random.Random`` seeded with ``seed * 2 + 1``) is consumed only by
  softmax sampling at temperature > 0.

Warm start: a window's replay starts from the cache and queue state that the traffic before
it left. ``prepare(..., warmup_s=W)`` also takes the requests of the W seconds before the
window (default: one window length, i.e. the previous window), replays them first and
marks them unscored; the summary covers the window's requests only. Window requests keep
their times (ms from the window start); warm-up ones have negative times.

No wall clock is read anywhere in the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from powerfleet.sim.engine import EngineConfig, Simulation
from powerfleet.sim.policy import SLA, RouterOptions, RouterPolicy
from powerfleet.sim.profile import CapCurve, TimingProfile, default_profile, validate_cap_fraction
from powerfleet.sim.summary import ReplaySummary, summarize
from powerfleet.sim.trace import TraceRequest, select_window


@dataclass(frozen=True)
class Arrivals:
    """A trace slice prepared for replay: sorted, rebased to ms from the slice start."""

    arrival_ms: list[float]
    isl: list[int]
    osl: list[int]
    hashes: list[tuple[int, ...]]
    window_ms: float
    scored: tuple[bool, ...] | None = None  # False for warm-up requests; None: all scored


def prepare(
    requests: Sequence[TraceRequest],
    *,
    seed: int = 0,
    speedup: float = 1.0,
    jitter_ms: float = 0.0,
    window: tuple[float | None, float | None] | None = None,
    warmup_s: float | None = None,
) -> Arrivals:
    """Cut the window, rebase, apply speedup and the policy-independent jitter (CRN).

    ``warmup_s``: seconds of traffic before the window replayed unscored first (``None``:
    one window length, the previous window; 0: a cold start). It is clipped at the
    trace's start.
    """
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"speedup must be a positive number, got {speedup}")
    if not (math.isfinite(jitter_ms) and jitter_ms >= 0):
        raise ValueError(f"jitter_ms must be >= 0, got {jitter_ms}")
    reqs = list(requests)
    t_trace0 = min((r.timestamp_ms for r in reqs), default=0.0)
    start_s, end_s = window if window is not None else (None, None)
    warm = warmup_span(window, warmup_s)
    if window is not None:
        reqs = select_window(reqs, None if start_s is None else start_s - warm, end_s)
    origin = t_trace0 + (start_s or 0.0) * 1000.0
    if reqs and start_s is None:
        origin = min(r.timestamp_ms for r in reqs)
    rng = np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, 0]))
    jit = rng.random(len(reqs)) * jitter_ms if jitter_ms > 0 else None
    rows = []
    for k, r in enumerate(reqs):
        t = (r.timestamp_ms - origin) / speedup
        if jit is not None:
            t += float(jit[k])
        rows.append((t, k, r))
    rows.sort(key=lambda x: (x[0], x[1]))
    scored = None
    if warm > 0:
        scored = tuple(x[2].timestamp_ms >= origin for x in rows)
    if window is not None and end_s is not None:
        window_ms = (end_s - (start_s or 0.0)) * 1000.0 / speedup
    elif rows:
        window_ms = (max(r.timestamp_ms for r in reqs) - origin) / speedup
    else:
        window_ms = 0.0
    return Arrivals(
        arrival_ms=[x[0] for x in rows],
        isl=[x[2].input_length for x in rows],
        osl=[x[2].output_length for x in rows],
        hashes=[x[2].hash_ids for x in rows],
        window_ms=window_ms,
        scored=scored,
    )


def warmup_span(window: tuple[float | None, float | None] | None, warmup_s: float | None) -> float:
    """Seconds of warm-up before ``window`` (``None``: one window length), clipped at 0 s."""
    if warmup_s is not None and not (math.isfinite(warmup_s) and warmup_s >= 0):
        raise ValueError(f"warm-up must be a finite number of seconds >= 0, got {warmup_s}")
    if window is None or not window[0]:
        return 0.0
    start, end = window
    assert start is not None
    if warmup_s is None:
        warmup_s = (end - start) if end is not None else 0.0
    return min(warmup_s, start)


def start_simulation(
    arr: Arrivals,
    workers: int,
    policy: RouterPolicy,
    seed: int,
    *,
    profile: TimingProfile,
    engine: EngineConfig | None = None,
    cap_fraction: float = 1.0,
    cap_curve: CapCurve | None = None,
    router: RouterOptions | None = None,
) -> Simulation:
    """A simulation of prepared arrivals, not yet run (the router stream is seeded from ``seed``)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    curve = cap_curve or CapCurve()
    validate_cap_fraction(cap_fraction, curve)
    return Simulation(
        arr.arrival_ms, arr.isl, arr.osl, arr.hashes, workers, policy, profile, engine or EngineConfig(),
        router_seed=seed * 2 + 1,
        prefill_speed=curve.prefill_throughput(cap_fraction),
        decode_speed=curve.decode_throughput(cap_fraction),
        router=router,
    )


def warm_snapshot(
    arr: Arrivals,
    workers: int,
    policy: RouterPolicy,
    seed: int = 0,
    *,
    profile: TimingProfile | None = None,
    engine: EngineConfig | None = None,
    cap_fraction: float = 1.0,
    cap_curve: CapCurve | None = None,
    router: RouterOptions | None = None,
) -> Simulation | None:
    """The state the warm-up span leaves when replayed under ``policy`` (the settings that
    served it), stopped at the window's start; None when ``arr`` has no warm-up. A sweep
    computes it once and forks it for every candidate."""
    if arr.scored is None:
        return None
    sim = start_simulation(arr, workers, policy, seed, profile=profile or default_profile(), engine=engine,
                           cap_fraction=cap_fraction, cap_curve=cap_curve, router=router)
    return sim.run(until=0.0)


def replay_arrivals(
    arr: Arrivals,
    workers: int,
    policy: RouterPolicy | None = None,
    seed: int = 0,
    *,
    sla: SLA | None = None,
    profile: TimingProfile | None = None,
    engine: EngineConfig | None = None,
    cap_fraction: float = 1.0,
    cap_curve: CapCurve | None = None,
    router: RouterOptions | None = None,
    warm: Simulation | None = None,
) -> ReplaySummary:
    """Replay prepared arrivals (the sweep prepares once and replays many policies);
    warm-up requests (``arr.scored``) are replayed but not summarised.

    ``warm``: a ``warm_snapshot`` of the same arrivals (and profile, engine, cap, router
    options); the window then continues from a copy of it under ``policy``. Without it the
    warm-up span is replayed under ``policy`` itself.
    """
    return replay_batches(arr, workers, policy, seed, sla=sla, profile=profile, engine=engine,
                          cap_fraction=cap_fraction, cap_curve=cap_curve, router=router, warm=warm)[0]


def replay_batches(
    arr: Arrivals,
    workers: int,
    policy: RouterPolicy | None = None,
    seed: int = 0,
    *,
    batches: int = 0,
    sla: SLA | None = None,
    warm: Simulation | None = None,
    **options: Any,
) -> tuple[ReplaySummary, list[ReplaySummary]]:
    """``replay_arrivals`` (the same keyword ``options``: profile, engine, cap_fraction,
    cap_curve, router) plus one summary per batch: the scored requests cut into ``batches``
    consecutive groups by arrival order. With common random numbers the same batch of two
    settings holds the same requests, so batches pair (the sweep's noise guard)."""
    policy = policy or RouterPolicy()
    profile: TimingProfile = options.pop("profile", None) or default_profile()
    cap_fraction: float = options.get("cap_fraction", 1.0)
    if warm is not None:
        sim = warm.fork(policy)
    else:
        sim = start_simulation(arr, workers, policy, seed, profile=profile, **options)
    res = sim.run().result()

    def summary(mask: tuple[bool, ...] | None) -> ReplaySummary:
        return summarize(res, arr.osl, workers=workers, gpus_per_worker=profile.gpus_per_replica,
                         window_ms=arr.window_ms, sla=sla, policy=policy, seed=seed, profile=profile.name,
                         cap_fraction=cap_fraction, scored=mask)

    return summary(arr.scored), [summary(m) for m in batch_masks(arr, res.arrival_ms, batches)]


def batch_masks(arr: Arrivals, arrival_ms: list[float], batches: int) -> list[tuple[bool, ...]]:
    """The scored requests cut into ``batches`` consecutive groups by arrival (none when fewer
    requests than batches): one mask per batch."""
    scored = [i for i in range(len(arr.osl)) if arr.scored is None or arr.scored[i]]
    masks: list[tuple[bool, ...]] = []
    if batches > 0 and len(scored) >= batches:
        order = sorted(scored, key=lambda i: arrival_ms[i])
        n = len(arr.osl)
        for b in range(batches):
            mask = [False] * n  # index writes, not a membership test per request and batch
            for i in order[b * len(order) // batches:(b + 1) * len(order) // batches]:
                mask[i] = True
            masks.append(tuple(mask))
    return masks


def replay(
    requests: Sequence[TraceRequest],
    workers: int,
    policy: RouterPolicy | None = None,
    seed: int = 0,
    *,
    sla: SLA | None = None,
    speedup: float = 1.0,
    window: tuple[float | None, float | None] | None = None,
    jitter_ms: float = 0.0,
    profile: TimingProfile | None = None,
    engine: EngineConfig | None = None,
    cap_fraction: float = 1.0,
    cap_curve: CapCurve | None = None,
    router: RouterOptions | None = None,
    warmup_s: float | None = None,
) -> ReplaySummary:
    """Replay trace requests over ``workers`` replicas under ``policy``; deterministic per seed.
    ``warmup_s`` as in ``prepare``: by default a window is warmed by the one before it."""
    arr = prepare(requests, seed=seed, speedup=speedup, jitter_ms=jitter_ms, window=window, warmup_s=warmup_s)
    return replay_arrivals(
        arr, workers, policy, seed, sla=sla, profile=profile, engine=engine,
        cap_fraction=cap_fraction, cap_curve=cap_curve, router=router,
    )


def parse_window(text: str | None) -> tuple[float | None, float | None] | None:
    """``START_S:END_S`` (either side may be empty) -> (start, end) seconds."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 2:
        raise ValueError(f"window must be START_S:END_S, got {text!r}")
    out: list[float | None] = []
    for p in parts:
        p = p.strip()
        if not p:
            out.append(None)
            continue
        try:
            v = float(p)
        except ValueError:
            raise ValueError(f"window must be START_S:END_S in seconds, got {text!r}") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"window bounds must be finite and >= 0, got {text!r}")
        out.append(v)
    if out[0] is not None and out[1] is not None and out[1] <= out[0]:
        raise ValueError(f"window end must be after its start, got {text!r}")
    return out[0], out[1]
