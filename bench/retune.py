"""Does retune pay off? Consecutive windows, each judged on the *next* window (not a test).

For every window i, retune sweeps window i with exactly the options the live loop uses
(``retune.settings.sweep_options`` of the default retune settings: default 108-point grid,
the search beyond its edge, warm start from the previous window, min improvement 1 %, the
noise guard, the time budget with the live harvest's stop rule (a search round only while a
shard timeout still fits); objective mean TTFT; tests/retune/test_one_path.py shows the
live window computes the same decision) and the live dwell (a knob moved may not move back
for ``retune.dwell_s`` in whole windows: 0 at 300 s windows, 3 at 20 s; ``keep (dwell)``)
starting from what it chose before, and the choice is then
replayed on window i+1 next to (a) the default settings held fixed and (b) the best single
fixed setting, chosen once by a sweep of the first window (so serving from window 1). The
judge (``retune_hindsight.judged``): window i+1 warmed by window i under what served window
i, a setting that moved at the boundary continuing from that state. Printed per window: mean
and p90 TTFT and mean ITL under (a), (b), (c = retune); then the mean gains of (c) over (a)
and (b) in mean TTFT, the worst window, the gains over (b) as judged before (every setting
replayed as if it had also served the window before), and the sweep wall time per window.

``--hindsight`` adds (d), the best fixed setting in hindsight, a bound no loop can know in
advance (``retune_hindsight.hindsight_bound``): searched on the judge's own mean over the
judged windows with the setting held from the start, over the live grid, the live edge
search and the settings the comparison used, so no fixed setting of that family beats it.

Traces: the first 1,800 s of conversation_trace.jsonl.gz and all of synthetic_trace.jsonl
(../shared/traces beside the clone).

Usage: python bench/retune.py [--window-s 300] [--workers 8] [--processes 2] [--traces conversation,synthetic]
       [--shift-z Z]  (the load-change detector's threshold; 0: off)  [--hindsight]
       [--untimed]  (no wall-clock stop for the edge search: deterministic figures on a loaded machine)
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any

from retune_hindsight import hindsight_bound, judged, measure

from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.guard import Move, dwell_blocks
from powerfleet.retune.settings import resolve, sweep_options
from powerfleet.retune.sweep import run_sweep
from powerfleet.retune.shift import Shift, scored_window
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.trace import TraceRequest, read_trace

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
KNOBS = ("overlap_score_credit", "prefill_load_scale", "temperature")
UNTIMED = ("every edge-search round runs, as on an idle machine: the live stop rule ends the search when a shard "
           "timeout no longer fits in the time budget, so on a loaded machine the decisions depend on the load")


def _fmt(p: RouterPolicy) -> str:
    return "/".join(f"{getattr(p, k):g}" for k in KNOBS)


def _gain(base: float, new: float) -> float:
    return 100.0 * (base - new) / base if base else 0.0


def live_settings(window_s: float, shift_z: float | None = None, timed: bool = True) -> dict[str, Any]:
    """The live loop's sweep options for a deployment with ``window_s`` windows (defaults
    otherwise; ``shift_z``: the load-change detector's threshold, 0 off, None the default;
    ``timed`` False: no wall-clock stop for the edge search, as on an idle machine)."""
    extra = {} if shift_z is None else {"shift_z": shift_z}
    cfg = RetuneConfig(deployments=["bench"], window_interval_s=int(window_s),
                       time_budget_s=min(240.0, 0.8 * window_s), shard_timeout_s=min(120.0, 0.5 * window_s), **extra)
    s = resolve(cfg, "bench")
    # The live harvest's stop rule: a search round goes out only while a shard still fits
    # before the deadline (harvest._search), i.e. while the elapsed time stays under the
    # budget less one shard timeout.
    opts = {**sweep_options(s), "budget_s": max(0.0, s.time_budget_s - s.shard_timeout_s) if timed else None}
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


def run(name: str, reqs: list[TraceRequest], span_s: float, window_s: float, workers: int,
        processes: int, shift_z: float | None = None, hindsight: bool = False,
        timed: bool = True) -> dict[int, tuple[float, float | None]]:
    """Print the table; returns each judged window's gain of retune over the best fixed setting
    chosen on the first window, and over the best in hindsight (None without ``hindsight``)."""
    n = int(-(-span_s // window_s))  # the last window may be partial
    live = live_settings(window_s, shift_z, timed)
    wins = [(i * window_s, min(span_s, (i + 1) * window_s)) for i in range(n)]
    t0 = min(r.timestamp_ms for r in reqs)
    ts, isl = [(r.timestamp_ms - t0) / 1000.0 for r in reqs], [r.input_length for r in reqs]
    print(f"\n== {name}: {len(reqs)} requests, {n} windows of {window_s:g} s, {workers} workers; "
          f"knobs shown as credit/prefill_load_scale/temperature")
    default = RouterPolicy()
    current = default
    best_fixed: RouterPolicy | None = None
    moves: dict[str, Move] = {}  # the live dwell (harvest: dwell_blocks on the state's moves)
    gains_a, gains_b, old_b, walls, used, ttft_c = [], [], [], [], [default], []
    points = 0
    print(f"{'win':>3} {'sweep s':>7} {'retune sets':>13} | {'(a) default':>21} | {'(b) best fixed':>21} | "
          f"{'(c) retune':>21} | gain c/a  c/b  (mean TTFT) | requests, confidence, decision")
    for i in range(n - 1):
        t = time.perf_counter()
        res, shift = _sweep(reqs, ts, isl, live, current, wins[i], window_s, workers, processes)
        walls.append(time.perf_counter() - t)
        points = max(points, len(res.candidates))
        b_before = best_fixed or default  # what served window i in (b): the default until it was chosen
        if best_fixed is None:
            ranked = res.decision.ranked
            best_fixed = RouterPolicy.model_validate(ranked[0].params) if ranked else default
        held = (dwell_blocks(moves, current.model_dump(), res.decision.params, i, live["guard"].dwell_windows)
                if res.decision.action == "apply" else None)
        c_before = current
        if res.decision.action == "apply" and held is None:
            prev = current.model_dump()
            moves.update({p: Move(i, prev[p]) for p, v in res.decision.params.items()
                          if p in prev and not math.isclose(v, prev[p])})
            current = RouterPolicy.model_validate(res.decision.params)
            used.append(current)
        nxt = wins[i + 1]
        a = measure(reqs, workers, default, nxt)
        b = judged(reqs, workers, b_before, best_fixed, nxt)
        c = judged(reqs, workers, c_before, current, nxt)
        ga, gb = _gain(a[0], c[0]), _gain(b[0], c[0])
        gains_a.append(ga)
        gains_b.append(gb)
        ttft_c.append(c[0])
        # the judge before: each setting as if it had also served the window before
        old_b.append(_gain(measure(reqs, workers, best_fixed, nxt)[0], measure(reqs, workers, current, nxt)[0]))
        cell = lambda m: f"{m[0]:7.0f} {m[1]:7.0f} {m[2]:5.1f}"  # noqa: E731
        dec = res.decision
        conf = f"{dec.confidence:.3f}" if dec.confidence is not None else "-"
        where = f" (scored from {shift.at_s - wins[i][0]:g} s in: {shift})" if shift is not None else ""
        print(f"{i + 1:>3} {walls[-1]:7.1f} {_fmt(current):>13} | {cell(a)} | {cell(b)} | {cell(c)} | "
              f"{ga:+6.1f}% {gb:+6.1f}% | {dec.requests}, {conf}, {'keep (dwell)' if held else dec.action}{where}",
              flush=True)
    print("columns per setting: mean TTFT ms, p90 TTFT ms, mean ITL ms; best fixed = "
          f"{_fmt(best_fixed or default)} (chosen on window 0, serving from window 1); a setting that moved "
          "at a window's start continues from the state its predecessor left")
    wa = min(range(len(gains_a)), key=lambda j: gains_a[j])
    wb = min(range(len(gains_b)), key=lambda j: gains_b[j])
    print(f"mean gain of retune in mean TTFT: {statistics.fmean(gains_a):+.1f}% over default, "
          f"{statistics.fmean(gains_b):+.1f}% over best fixed; worst window vs default: {wa + 1} "
          f"({gains_a[wa]:+.1f}%), vs best fixed: {wb + 1} ({gains_b[wb]:+.1f}%)")
    print(f"judged as before (every setting as if it had also served the window before): {statistics.fmean(old_b):+.1f}% "
          "over best fixed; per window " + " ".join(f"{g:+.1f}%" for g in old_b))
    print(f"sweep wall time per window: mean {statistics.fmean(walls):.1f} s, max {max(walls):.1f} s "
          f"({processes} processes, {points} candidates + probe)")
    gains_d: list[float] = []
    if hindsight:
        t = time.perf_counter()
        hind, hind_ttft, tried = hindsight_bound(reqs, live, wins, workers, processes, [best_fixed or default, *used])
        gains_d = [_gain(d, c) for d, c in zip(hind_ttft, ttft_c)]
        print(f"best fixed setting in hindsight (d) = {_fmt(hind)}: mean TTFT {statistics.fmean(hind_ttft):.0f} ms "
              f"over windows 1-{n - 1}, the lowest of {tried} fixed settings (grid, edge search, (a), (b) and every "
              f"setting (c) used; {time.perf_counter() - t:.0f} s); retune over (d): "
              f"{statistics.fmean(gains_d):+.1f}% mean, per window " + " ".join(f"{g:+.1f}%" for g in gains_d))
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
    ap.add_argument("--untimed", action="store_true", help=UNTIMED)
    args = ap.parse_args()
    which = set(args.traces.split(","))
    if "conversation" in which:
        conv = read_trace(TRACES / "conversation_trace.jsonl.gz").requests
        t0 = min(r.timestamp_ms for r in conv)
        conv = [r for r in conv if r.timestamp_ms < t0 + 1_800_000]
        run("conversation_trace.jsonl.gz, first 1,800 s", conv, 1800.0, args.window_s, args.workers, args.processes,
            args.shift_z, args.hindsight, not args.untimed)
    if "synthetic" in which:
        syn = read_trace(TRACES / "synthetic_trace.jsonl").requests
        ts = [r.timestamp_ms for r in syn]
        span = (max(ts) - min(ts)) / 1000.0
        run("synthetic_trace.jsonl, all", syn, span + 0.001, args.window_s, args.workers, args.processes, args.shift_z,
            args.hindsight, not args.untimed)


if __name__ == "__main__":
    main()
