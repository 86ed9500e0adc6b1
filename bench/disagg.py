"""The disaggregated replay: its speed, and whether retune pays off on it (not a test).

1. speed: the whole conversation trace replayed as 8 aggregated workers and as 4 prefill +
   4 decode workers (the default profile, 64 GB/s link): wall time and simulated s per wall s;
2. retune: consecutive windows of the first 1,800 s of the conversation trace, each swept
   with the live loop's options (``retune.settings.sweep_options`` and ``pools``: grid, edge
   search, warm start, noise guard) over the pools, starting from what it chose before, and
   the choice replayed on the next window next to the default settings.

Usage: python bench/disagg.py [--window-s 300] [--prefill 4] [--decode 4] [--processes 2] [--windows N]
       [--no-speed]  (N: sweep only the first N windows; --no-speed: skip part 1)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.settings import pools, resolve, sweep_options
from powerfleet.retune.sweep import run_sweep
from powerfleet.sim import disagg
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.replay import replay
from powerfleet.sim.trace import TraceRequest, read_trace, select_window

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
KNOBS = ("overlap_score_credit", "prefill_load_scale", "temperature")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=300.0)
    ap.add_argument("--prefill", type=int, default=4)
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--windows", type=int, default=None, help="sweep only the first N windows")
    ap.add_argument("--no-speed", action="store_true", help="skip the whole-trace speed replay")
    args = ap.parse_args()
    conv = read_trace(TRACES / "conversation_trace.jsonl.gz").requests
    if not args.no_speed:
        speed(conv, args.prefill, args.decode)
    sweeps(conv, args.window_s, args.prefill, args.decode, args.processes, args.windows)


def speed(conv: list[TraceRequest], prefill: int, decode: int) -> None:
    t = time.perf_counter()
    agg = replay(conv, prefill + decode, RouterPolicy())
    ta = time.perf_counter() - t
    t = time.perf_counter()
    dis = disagg.replay(conv, disagg.Pools(prefill, decode), RouterPolicy())
    td = time.perf_counter() - t
    print(f"speed: whole conversation trace ({agg.requests} requests): {prefill + decode} aggregated "
          f"{ta:.2f} s wall ({agg.duration_s / ta:.0f} simulated s per wall s), {prefill}P+{decode}D "
          f"{td:.2f} s wall ({dis.duration_s / td:.0f}); mean TTFT {agg.ttft_ms.mean:.0f} vs {dis.ttft_ms.mean:.0f} ms, "
          f"ITL {agg.itl_ms.mean:.1f} vs {dis.itl_ms.mean:.1f} ms", flush=True)


def sweeps(conv: list[TraceRequest], w: float, prefill: int, decode: int, processes: int,
           windows: int | None) -> None:
    cfg = RetuneConfig(deployments=["bench"], window_interval_s=int(w), time_budget_s=min(240.0, 0.8 * w),
                       shard_timeout_s=min(120.0, 0.5 * w))
    s = resolve(cfg, "bench")
    p = pools(s, prefill, decode)
    reqs = select_window(conv, 0, 1800)
    current = RouterPolicy()
    gains = []
    print(f"retune on {prefill}P+{decode}D, windows of {w:g} s; knobs credit/scale/temperature")
    k = 1
    walls, replayed = [], []
    while (k + 1) * w <= 1800 and (windows is None or k <= windows):
        t = time.perf_counter()
        res = run_sweep(reqs, p, s.objective, current, s.grid, window=((k - 1) * w, k * w),
                        processes=processes, **sweep_options(s))
        wall = time.perf_counter() - t
        walls.append(wall)
        replayed.append(len(res.candidates) + 1)  # the probe too
        if res.decision.action == "apply":
            current = RouterPolicy(**res.decision.params)
        nxt = (k * w, (k + 1) * w)
        got = disagg.replay(reqs, p, current, window=nxt)
        base = disagg.replay(reqs, p, RouterPolicy(), window=nxt)
        gain = 100.0 * (1 - (got.ttft_ms.mean or 0) / (base.ttft_ms.mean or 1))
        gains.append(gain)
        knobs = "/".join(f"{getattr(current, x):g}" for x in KNOBS)
        print(f"window {k}: sweep {wall:5.1f} s, {replayed[-1]} replays, {res.decision.action:<5} -> {knobs:<12} "
              f"next window mean TTFT "
              f"{got.ttft_ms.mean:7.0f} vs default {base.ttft_ms.mean:7.0f} ms ({gain:+.1f} %), "
              f"confidence {res.decision.confidence}", flush=True)
        k += 1
    print(f"mean gain over default: {sum(gains) / len(gains):+.1f} %; sweep wall per window: mean "
          f"{sum(walls) / len(walls):.1f} s, replays per window: mean {sum(replayed) / len(replayed):.1f} "
          f"({processes} processes)")


if __name__ == "__main__":
    main()
