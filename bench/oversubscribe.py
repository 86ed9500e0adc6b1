"""Oversubscription benchmark (not a test): GPUs hosted under one limit against cap-sum budgeting.

1. For each ratio (1.0, 1.2, 1.3, 1.4) hosts ``ratio x`` the workers that cap-sum budgeting
   admits under the same limit (the limit stays the cap sum of the base fleet), with the
   traffic scaled in proportion so that each GPU carries the same load, and replays it under
   the guard (``powerfleet power whatif``'s code). Prints GPUs hosted, goodput per GPU
   against the cap-sum fleet and against the same fleet without a limit (the guard's own
   cost), excursions over the limit, capped GPU time and capping events, and the TTFT / ITL
   p99 by priority. Calibration traffic only: the first 30 minutes of the conversation
   trace and the synthetic trace.
2. Times ``power whatif`` on an hour of traffic on 64 GPUs (16 workers of 4): the first
   30 minutes of the conversation trace tiled to an hour at twice its rate (each copy's
   prompt blocks renamed, so the copies share no cache), which loads each GPU as the
   8-worker replay of docs/power.md does.

Usage: python bench/oversubscribe.py [--base-workers 10] [--sla ttft_ms=3000,itl_ms=60] [--guard JSON]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from powerfleet.power.guard import GuardSettings
from powerfleet.power.inputs import parse_sla_pairs
from powerfleet.power.report import WhatIfReport, report
from powerfleet.power.whatif import WhatIfConfig, run_whatif
from powerfleet.sim.replay import prepare
from powerfleet.sim.trace import TraceRequest, read_trace

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
RATIOS = (1.0, 1.2, 1.3, 1.4)
CAP_W, GPUS_PER_WORKER = 700.0, 4


def whatif(reqs: list[TraceRequest], window: tuple[float, float] | None, workers: int, limit_w: float,
           scale: float, sla: object, guard: GuardSettings,
           loss: tuple[float, float] | None = None) -> tuple[WhatIfReport, float]:
    arr = prepare(reqs, speedup=scale, window=window, warmup_s=0.0)
    cfg = WhatIfConfig(workers=workers, gpus_per_worker=GPUS_PER_WORKER, cap_w=CAP_W, limit_w=limit_w,
                       load_scale=scale, sla=sla, telemetry_loss=loss, guard=guard)
    t = time.perf_counter()
    rep = report(run_whatif(arr, cfg))
    return rep, time.perf_counter() - t


def ratios(name: str, reqs: list[TraceRequest], window: tuple[float, float] | None, base_workers: int,
           base_scale: float, sla: object, guard: GuardSettings) -> None:
    limit = base_workers * GPUS_PER_WORKER * CAP_W
    print(f"\n{name}: limit {limit:.0f} W = cap sum of {base_workers} workers x {GPUS_PER_WORKER} GPUs x "
          f"{CAP_W:.0f} W; base load x{base_scale:g}; traffic scaled with the fleet")
    print("| ratio | GPUs (vs cap-sum) | goodput/GPU vs cap-sum | vs same fleet unlimited | excursions (count, "
          "longest s, max over W) | capped GPU time | capping events/GPU-h | TTFT p99 high/low ms | "
          "ITL p99 high/low ms | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base_per_gpu = None
    for r in RATIOS:
        workers = round(base_workers * r)
        scale = base_scale * workers / base_workers
        rep, wall = whatif(reqs, window, workers, limit, scale, sla, guard)
        free, _ = whatif(reqs, window, workers, workers * GPUS_PER_WORKER * CAP_W, scale, sla, guard)
        per_gpu = rep.goodput_rps / rep.gpus
        if base_per_gpu is None:
            base_per_gpu = per_gpu
        e, hi, lo = rep.excursions, rep.by_priority["high"], rep.by_priority["low"]
        print(f"| {r:.1f} | {rep.gpus} (+{100 * (rep.gpus / (base_workers * GPUS_PER_WORKER) - 1):.0f} %) | "
              f"{100 * (per_gpu / base_per_gpu - 1):+.1f} % | {100 * (rep.goodput_rps / free.goodput_rps - 1):+.1f} % | "
              f"{e.count}, {e.longest_s}, {e.max_over_w:.0f} | {100 * rep.capped.gpu_time_fraction:.1f} % | "
              f"{rep.capped.events_per_gpu_hour:.0f} | {hi.ttft_ms.p99:.0f} / {lo.ttft_ms.p99:.0f} | "
              f"{hi.itl_ms.p99:.0f} / {lo.itl_ms.p99:.0f} | {wall:.1f} |")
    r = 1.3
    workers = round(base_workers * r)
    rep, _ = whatif(reqs, window, workers, limit, base_scale * workers / base_workers, sla, guard,
                    loss=(300.0, 360.0))
    print(f"ratio 1.3 with a 60 s telemetry loss at 300 s: fallback {rep.fallback.activations} node activations, "
          f"longest reaction {rep.fallback.longest_reaction_s} s; excursions {rep.excursions.count}, longest "
          f"{rep.excursions.longest_s} s")


def tiled_hour(reqs: list[TraceRequest]) -> list[TraceRequest]:
    """The first 30 minutes, four copies: two at once, two 1800 s later; copies share no prompt block."""
    first = [r for r in reqs if r.timestamp_ms - reqs[0].timestamp_ms < 1_800_000]
    out = []
    for copy in range(4):
        shift = 1_800_000.0 * (copy // 2)
        rename = 10_000_000 * copy
        out += [replace(r, timestamp_ms=r.timestamp_ms + shift, hash_ids=tuple(h + rename for h in r.hash_ids))
                for r in first]
    return sorted(out, key=lambda r: r.timestamp_ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-workers", type=int, default=10)
    ap.add_argument("--sla", default="ttft_ms=3000,itl_ms=60")
    ap.add_argument("--guard", default=None, help="JSON guard settings (as `power whatif --guard`)")
    args = ap.parse_args()
    sla = parse_sla_pairs(args.sla)
    guard = GuardSettings.model_validate_json(args.guard) if args.guard else GuardSettings()
    print(f"guard: {guard.model_dump()}; SLA {sla}")
    conv = read_trace(TRACES / "conversation_trace.jsonl.gz").requests
    synth = read_trace(TRACES / "synthetic_trace.jsonl").requests
    # base load: each GPU as loaded as 8 workers under the conversation trace's own rate
    ratios("conversation 0:1800", conv, (0.0, 1800.0), args.base_workers, args.base_workers / 8, sla, guard)
    ratios("synthetic (whole, 1022 s)", synth, None, args.base_workers, args.base_workers / 8, sla, guard)
    hour = tiled_hour(conv)
    rep, wall = whatif(hour, None, 16, 16 * GPUS_PER_WORKER * CAP_W / 1.3, 1.0, sla, guard, loss=(1800.0, 1860.0))
    print(f"\nwhat-if wall time: {len(hour)} requests, {rep.duration_s:.0f} simulated s on {rep.gpus} GPUs at 1.3x: "
          f"{wall:.1f} s ({rep.duration_s / wall:.0f} simulated s per wall s); excursions {rep.excursions.count}, "
          f"longest {rep.excursions.longest_s} s")


if __name__ == "__main__":
    main()
