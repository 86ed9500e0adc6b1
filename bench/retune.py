"""Does retune pay off? Consecutive windows, each judged on the *next* window (not a test).

For every window i, retune sweeps window i with exactly the options the live loop uses
(``retune.settings.sweep_options`` of the default retune settings: default 108-point grid,
the search beyond its edge, warm start from the previous window, min improvement 1 %, the
noise guard, the time budget with the live harvest's stop rule (a search round only while a
shard timeout still fits); objective mean TTFT; tests/retune/test_one_path.py shows the
live window computes the same decision) and the live dwell (a knob moved may not move back
for ``dwell_windows`` windows: ``keep (dwell)``) starting from what it chose before, and the choice is then
replayed on window i+1 next to (a) the default settings held fixed and (b) the best single
fixed setting, chosen once by a sweep of the first window. Printed per window: mean and p90
TTFT and mean ITL under (a), (b), (c = retune); then the mean gains of (c) over (a) and (b)
in mean TTFT, the worst window, and the sweep wall time per window.

``--hindsight`` adds (d), the best single setting in hindsight, a bound no loop can know in
advance: one sweep replays every candidate over the whole judged span (windows 1 to the end,
warmed by window 0), and of its five best the one with the lowest mean over the judged
windows (each replayed as (a)-(c) are) is held fixed. (c) over (d) says whether following the
traffic beats the one setting that suited all of it.

Traces: the first 1,800 s of conversation_trace.jsonl.gz and all of synthetic_trace.jsonl
(../shared/traces beside the clone).

Usage: python bench/retune.py [--window-s 300] [--workers 8] [--processes 2] [--traces conversation,synthetic]
       [--shift-z Z]  (the load-change detector's threshold; 0: off)  [--hindsight]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.guard import Move, dwell_blocks
from powerfleet.retune.settings import resolve, sweep_options
from powerfleet.retune.sweep import run_sweep
from powerfleet.retune.shift import Shift, scored_window
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.profile import default_profile
from powerfleet.sim.replay import prepare, start_simulation
from powerfleet.sim.summary import summarize
from powerfleet.sim.trace import TraceRequest, read_trace

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
KNOBS = ("overlap_score_credit", "prefill_load_scale", "temperature")


def _fmt(p: RouterPolicy) -> str:
    return "/".join(f"{getattr(p, k):g}" for k in KNOBS)


def _measure(reqs: list[TraceRequest], workers: int, pol: RouterPolicy, win: tuple[float, float],
             switch: tuple[float, RouterPolicy] | None = None) -> tuple[float, float, float]:
    """Replay ``win`` (warmed by the window before) under ``pol``; with ``switch`` = (t, new) the
    routers move to ``new`` at t seconds (an early re-decision), the state carried over."""
    arr = prepare(reqs, seed=0, window=win)
    prof = default_profile()
    sim = start_simulation(arr, workers, pol, 0, profile=prof)
    if switch is not None:
        sim = sim.run(until=(switch[0] - win[0]) * 1000.0).fork(switch[1])
    s = summarize(sim.run().result(), arr.osl, workers=workers, gpus_per_worker=prof.gpus_per_replica,
                  window_ms=arr.window_ms, sla=None, policy=pol, seed=0, profile=prof.name, cap_fraction=1.0,
                  scored=arr.scored)
    return (s.ttft_ms.mean or float("nan"), s.ttft_ms.p90 or float("nan"), s.itl_ms.mean or float("nan"))


def _gain(base: float, new: float) -> float:
    return 100.0 * (base - new) / base if base else 0.0


def live_settings(window_s: float, shift_z: float | None = None) -> dict[str, Any]:
    """The live loop's sweep options for a deployment with ``window_s`` windows (defaults
    otherwise; ``shift_z``: the load-change detector's threshold, 0 off, None the default)."""
    extra = {} if shift_z is None else {"shift_z": shift_z}
    cfg = RetuneConfig(deployments=["bench"], window_interval_s=int(window_s),
                       time_budget_s=min(240.0, 0.8 * window_s), shard_timeout_s=min(120.0, 0.5 * window_s), **extra)
    s = resolve(cfg, "bench")
    # The live harvest's stop rule: a search round goes out only while a shard still fits
    # before the deadline (harvest._search), i.e. while the elapsed time stays under the
    # budget less one shard timeout.
    opts = {**sweep_options(s), "budget_s": max(0.0, s.time_budget_s - s.shard_timeout_s)}
    return {"grid": s.grid, "objective": s.objective, "shift": s.shift, **opts}


def _sweep(reqs: list[TraceRequest], ts: list[float], isl: list[int], live: dict, current: RouterPolicy,
           win: tuple[float, float], lookback_s: float, workers: int, processes: int) -> tuple[Any, Shift | None]:
    """The live window's sweep of ``win``: scored from a load change inside it when one is found
    (``retune.shift.scored_window`` on the span's own arrivals, as ``live.launch_window``), the
    traffic before the change warming up."""
    opts = {k: v for k, v in live.items() if k not in ("grid", "objective", "shift")}
    window, warmup, shift = scored_window(ts, isl, win, lookback_s, live["shift"], live["guard"].min_requests)
    res = run_sweep(reqs, workers, live["objective"], current, live["grid"], window=window, warmup_s=warmup, seed=0,
                    processes=processes, **opts)
    return res, shift


def hindsight_fixed(reqs: list[TraceRequest], live: dict, wins: list[tuple[float, float]], workers: int,
                    processes: int) -> tuple[RouterPolicy, list[float]]:
    """The best single setting in hindsight over the judged windows ``wins[1:]`` and its mean
    TTFT in each: the sweep's five best over the whole span, re-measured window by window."""
    opts = {k: v for k, v in live.items() if k not in ("grid", "objective", "shift", "guard", "budget_s")}
    span = (wins[1][0], wins[-1][1])
    res = run_sweep(reqs, workers, live["objective"], RouterPolicy(), live["grid"], window=span,
                    warmup_s=wins[0][1] - wins[0][0], seed=0, processes=processes, budget_s=None, **opts)
    top = [RouterPolicy.model_validate(c.params) for c in res.decision.ranked[:5]] or [RouterPolicy()]
    per = [[_measure(reqs, workers, p, w)[0] for w in wins[1:]] for p in top]
    j = min(range(len(top)), key=lambda k: statistics.fmean(per[k]))
    return top[j], per[j]


def run(name: str, reqs: list[TraceRequest], span_s: float, window_s: float, workers: int,
        processes: int, shift_z: float | None = None, hindsight: bool = False) -> dict[int, tuple[float, float | None]]:
    """Print the table; returns each judged window's gain of retune over the best fixed setting
    chosen on the first window, and over the best in hindsight (None without ``hindsight``)."""
    n = int(-(-span_s // window_s))  # the last window may be partial
    live = live_settings(window_s, shift_z)
    wins = [(i * window_s, min(span_s, (i + 1) * window_s)) for i in range(n)]
    hind, hind_ttft = hindsight_fixed(reqs, live, wins, workers, processes) if hindsight else (None, [])
    t0 = min(r.timestamp_ms for r in reqs)
    ts, isl = [(r.timestamp_ms - t0) / 1000.0 for r in reqs], [r.input_length for r in reqs]
    print(f"\n== {name}: {len(reqs)} requests, {n} windows of {window_s:g} s, {workers} workers; "
          f"knobs shown as credit/prefill_load_scale/temperature")
    default = RouterPolicy()
    current = default
    best_fixed: RouterPolicy | None = None
    moves: dict[str, Move] = {}  # the live dwell (harvest: dwell_blocks on the state's moves)
    gains_a, gains_b, gains_d, walls = [], [], [], []
    points = 0
    print(f"{'win':>3} {'sweep s':>7} {'retune sets':>13} | {'(a) default':>21} | {'(b) best fixed':>21} | "
          f"{'(c) retune':>21} | gain c/a  c/b  (mean TTFT)" + (" c/d" if hind else "")
          + " | requests, confidence, decision")
    for i in range(n - 1):
        t = time.perf_counter()
        res, shift = _sweep(reqs, ts, isl, live, current, wins[i], window_s, workers, processes)
        walls.append(time.perf_counter() - t)
        points = max(points, len(res.candidates))
        if best_fixed is None:
            ranked = res.decision.ranked
            best_fixed = RouterPolicy.model_validate(ranked[0].params) if ranked else default
        held = (dwell_blocks(moves, current.model_dump(), res.decision.params, i, live["guard"].dwell_windows)
                if res.decision.action == "apply" else None)
        if res.decision.action == "apply" and held is None:
            prev = current.model_dump()
            moves.update({p: Move(i, prev[p]) for p, v in res.decision.params.items()
                          if p in prev and not math.isclose(v, prev[p])})
            current = RouterPolicy.model_validate(res.decision.params)
        nxt = wins[i + 1]
        a = _measure(reqs, workers, default, nxt)
        b = _measure(reqs, workers, best_fixed, nxt)
        c = _measure(reqs, workers, current, nxt)
        ga, gb = _gain(a[0], c[0]), _gain(b[0], c[0])
        gains_a.append(ga)
        gains_b.append(gb)
        gd = _gain(hind_ttft[i], c[0]) if hind is not None else None
        if gd is not None:
            gains_d.append(gd)
        cell = lambda m: f"{m[0]:7.0f} {m[1]:7.0f} {m[2]:5.1f}"  # noqa: E731
        dec = res.decision
        conf = f"{dec.confidence:.3f}" if dec.confidence is not None else "-"
        where = f" (scored from {shift.at_s - wins[i][0]:g} s in: {shift})" if shift is not None else ""
        print(f"{i + 1:>3} {walls[-1]:7.1f} {_fmt(current):>13} | {cell(a)} | {cell(b)} | {cell(c)} | "
              f"{ga:+6.1f}% {gb:+6.1f}%" + (f" {gd:+6.1f}%" if gd is not None else "")
              + f" | {dec.requests}, {conf}, {'keep (dwell)' if held else dec.action}{where}")
    print("columns per setting: mean TTFT ms, p90 TTFT ms, mean ITL ms; best fixed = "
          f"{_fmt(best_fixed or default)} (from window 0)"
          + (f"; best in hindsight (d) = {_fmt(hind)}, mean TTFT {statistics.fmean(hind_ttft):.0f} ms" if hind else ""))
    wa = min(range(len(gains_a)), key=lambda j: gains_a[j])
    wb = min(range(len(gains_b)), key=lambda j: gains_b[j])
    print(f"mean gain of retune in mean TTFT: {statistics.fmean(gains_a):+.1f}% over default, "
          f"{statistics.fmean(gains_b):+.1f}% over best fixed; worst window vs default: {wa + 1} "
          f"({gains_a[wa]:+.1f}%), vs best fixed: {wb + 1} ({gains_b[wb]:+.1f}%)"
          + (f"; {statistics.fmean(gains_d):+.1f}% over the best in hindsight" if gains_d else ""))
    print(f"sweep wall time per window: mean {statistics.fmean(walls):.1f} s, max {max(walls):.1f} s "
          f"({processes} processes, {points} candidates + probe)")
    return {i + 1: (g, gains_d[i] if gains_d else None) for i, g in enumerate(gains_b)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=300.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--traces", default="conversation,synthetic")
    ap.add_argument("--shift-z", type=float, default=None,
                    help="the load-change detector's threshold (retune.shift_z; 0: off; default: the live default)")
    ap.add_argument("--hindsight", action="store_true",
                    help="also hold the best single setting in hindsight fixed (column d)")
    args = ap.parse_args()
    which = set(args.traces.split(","))
    if "conversation" in which:
        conv = read_trace(TRACES / "conversation_trace.jsonl.gz").requests
        t0 = min(r.timestamp_ms for r in conv)
        conv = [r for r in conv if r.timestamp_ms < t0 + 1_800_000]
        run("conversation_trace.jsonl.gz, first 1,800 s", conv, 1800.0, args.window_s, args.workers, args.processes,
            args.shift_z, args.hindsight)
    if "synthetic" in which:
        syn = read_trace(TRACES / "synthetic_trace.jsonl").requests
        ts = [r.timestamp_ms for r in syn]
        span = (max(ts) - min(ts)) / 1000.0
        run("synthetic_trace.jsonl, all", syn, span + 0.001, args.window_s, args.workers, args.processes, args.shift_z,
            args.hindsight)


if __name__ == "__main__":
    main()
