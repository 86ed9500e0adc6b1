"""Simulator speed benchmark (not a test).

1. Replays conversation_trace.jsonl.gz (12,031 requests, 3,537 s) over 8 workers on one
   core and prints simulated seconds per wall second and requests per wall second
   (goal: >= 5,000 simulated s per wall s), with the new mechanisms off and on.
2. Runs the default 108-point sweep on a 20-minute window of it over 2 processes, warm
   started by the previous 20 minutes and searching beyond the grid's edge, and prints the
   sweep wall time as a fraction of the window length (goal: < 1 %), and its CPU seconds over
   the processes (the figure a loaded machine does not inflate) with the load average.

Usage: python bench/sim.py [--trace PATH] [--window START_S:END_S] [--processes N]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.settings import resolve, sweep_options
from powerfleet.retune.sweep import run_sweep
from powerfleet.sim.engine import EngineConfig
from powerfleet.sim.policy import RouterOptions, RouterPolicy
from powerfleet.sim.replay import parse_window, replay
from powerfleet.sim.trace import read_trace

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACES / "conversation_trace.jsonl.gz"))
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--window", default="1800:3000", help="20-minute sweep window (s)")
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()

    t = time.perf_counter()
    trace = read_trace(args.trace)
    t_read = time.perf_counter() - t
    print(f"read {len(trace.requests)} requests in {t_read:.2f} s ({len(trace.issues)} issues)")

    every = RouterOptions(router_queue_threshold=1.0, router_prefill_load_model="ais", kv_event_lag_ms=200,
                          router_track_output_blocks=True, router_tie_break="random")
    for name, opts, eng in (("defaults", None, None),
                            ("every new mechanism on", every, EngineConfig(kv_allocation="incremental"))):
        t = time.perf_counter()
        s = replay(trace.requests, args.workers, RouterPolicy(), seed=0, router=opts, engine=eng)
        wall = time.perf_counter() - t
        print(
            f"replay ({name}): {s.requests} requests, {s.duration_s:.0f} simulated s, {args.workers} workers, "
            f"wall {wall:.2f} s -> {s.duration_s / wall:.0f} simulated s per wall s, "
            f"{s.requests / wall:.0f} requests per wall s"
        )

    win = parse_window(args.window)
    assert win is not None and win[0] is not None and win[1] is not None
    length = win[1] - win[0]
    t = time.perf_counter()
    cpu0 = _cpu_s()
    # The live loop's options for a deployment with windows of this length (one sweep path).
    live = resolve(RetuneConfig(deployments=["bench"], window_interval_s=int(length),
                                time_budget_s=min(240.0, 0.8 * length), shard_timeout_s=min(120.0, 0.5 * length)),
                   "bench")
    res = run_sweep(trace.requests, args.workers, live.objective, RouterPolicy(), live.grid, window=win, seed=0,
                    processes=args.processes, **sweep_options(live))
    sweep_wall = time.perf_counter() - t
    sweep_cpu = _cpu_s() - cpu0
    knobs = ("overlap_score_credit", "prefill_load_scale", "temperature")
    print(
        f"sweep: {res.grid_points} grid points + {res.search_points} beyond its edge + probe on window "
        f"{args.window} ({length:.0f} s, warm-up {res.warmup_s:.0f} s), {args.processes} processes, "
        f"wall {sweep_wall:.2f} s = {100 * sweep_wall / length:.2f} % of the window; decision "
        f"{res.decision.action} {({k: res.decision.params[k] for k in knobs})}"
    )
    # On a shared machine the wall time measures the load as much as the sweep: the CPU seconds
    # of every sweep process (this one and the pool's) over the cores they had is the sweep's own.
    load = os.getloadavg()
    print(f"sweep CPU {sweep_cpu:.2f} s over {args.processes} processes = {sweep_cpu / args.processes:.2f} s per core "
          f"= {100 * sweep_cpu / args.processes / length:.2f} % of the window (the least wall time on {args.processes} "
          f"idle cores); "
          f"load average during the run {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on {os.cpu_count()} cores")


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the sweep's process pool)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    main()
