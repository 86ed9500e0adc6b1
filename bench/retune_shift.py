"""Retune when the load changes: does the loop pull ahead of a setting chosen once? (not a test)

Calibration traffic only: the first 30 minutes of conversation_trace.jsonl.gz, replayed in
phases whose arrival rate changes between windows. Each phase takes the next requests of the
source in order and compresses or stretches their inter-arrival gaps by the phase's rate
factor (1.5: the rate rises by half; 0.5: it falls by half), so the requests (and their
prefix sharing) stay those of the trace. The loop is bench/retune.py's (the live options,
including the load-change detector that scores a window from a change inside it); printed:
the table, the mean gain over the best fixed setting (chosen on the first window) and the
worst window right after each change.

Usage: python bench/retune_shift.py [--window-s 300] [--workers 8] [--processes 2]
       [--phases 1,1.5,0.5]  (rate factor per phase; two windows per phase)
       [--offset-s S]  (each change S seconds into a window instead of on its boundary)
       [--shift-z Z]   (the detector's threshold, retune.shift_z; 0: off)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retune import TRACES, run  # noqa: E402  (bench/retune.py: one loop, the live options)

from powerfleet.sim.trace import TraceRequest, read_trace  # noqa: E402


def shifted(reqs: list[TraceRequest], window_s: float, factors: list[float], per_phase: int,
            offset_s: float = 0.0) -> list[TraceRequest]:
    """The source's requests in order, re-timed phase by phase (rate x factor); each change
    comes ``offset_s`` seconds after a window boundary (0: on it), the last phase runs to the
    end of ``len(factors) * per_phase`` windows."""
    src = sorted(reqs, key=lambda r: r.timestamp_ms)
    out: list[TraceRequest] = []
    t_out, prev_src, i = 0.0, src[0].timestamp_ms, 0
    for phase, f in enumerate(factors):
        last = phase == len(factors) - 1
        end = (len(factors) if last else phase + 1) * per_phase * window_s * 1000.0 + (0 if last else offset_s * 1000.0)
        while i < len(src) and t_out < end:
            t_out += (src[i].timestamp_ms - prev_src) / f
            prev_src = src[i].timestamp_ms
            if t_out < end:
                out.append(replace(src[i], timestamp_ms=t_out))
            i += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=300.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--phases", default="1,1.5,0.5")
    ap.add_argument("--windows-per-phase", type=int, default=2)
    ap.add_argument("--shift-z", type=float, default=None,
                    help="the load-change detector's threshold (retune.shift_z; 0: off; default: the live default)")
    ap.add_argument("--offset-s", type=float, default=0.0, help="each change this long after a window boundary")
    args = ap.parse_args()
    factors = [float(x) for x in args.phases.split(",")]
    conv = read_trace(TRACES / "conversation_trace.jsonl.gz").requests
    t0 = min(r.timestamp_ms for r in conv)
    calib = [r for r in conv if r.timestamp_ms < t0 + 1_800_000]  # calibration part only
    reqs = shifted(calib, args.window_s, factors, args.windows_per_phase, args.offset_s)
    span = len(factors) * args.windows_per_phase * args.window_s
    gains = run(f"conversation 0:1800 re-timed, rate factors {factors} x {args.windows_per_phase} windows"
                + (f", each change {args.offset_s:g} s into a window" if args.offset_s else ""),
                reqs, span, args.window_s, args.workers, args.processes, args.shift_z)
    # the judged window right after each change: the one it starts (on a boundary) or the next one
    changes = [p * args.windows_per_phase + (1 if args.offset_s else 0) for p in range(1, len(factors))]
    after = {w: gains[w] for w in changes if w in gains}
    worst = min(after, key=lambda w: after[w]) if after else None
    print(f"mean gain over the best fixed setting: {statistics.fmean(gains.values()):+.1f}%; windows right after a "
          f"change: " + ", ".join(f"{w} ({g:+.1f}%)" for w, g in after.items())
          + (f"; worst {worst} ({after[worst]:+.1f}%)" if worst is not None else ""))


if __name__ == "__main__":
    main()
