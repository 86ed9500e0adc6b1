"""Retune when the load changes: does the loop pull ahead of a setting chosen once? (not a test)

Calibration traffic only: the first 30 minutes of conversation_trace.jsonl.gz (or, with
``--trace synthetic``, all of synthetic_trace.jsonl), replayed in phases whose arrival rate
changes between windows. Each phase takes the next requests of the
source in order and compresses or stretches their inter-arrival gaps by the phase's rate
factor (1.5: the rate rises by half; 0.5: it falls by half), so the requests (and their
prefix sharing) stay those of the trace. The loop is bench/retune.py's (the live options,
including the load-change detector that scores a window from a change inside it); printed:
the table, the mean gain over the best fixed setting (chosen on the first window, serving
from the second) and over the best fixed setting in hindsight ((d), bench/retune_hindsight.py:
searched on the judge's own mean, a bound for fixed settings no loop can know in advance), and
the gains in the window right after each change.

Usage: python bench/retune_shift.py [--trace conversation|synthetic] [--window-s 300] [--workers 8] [--processes 2]
       [--phases 1,1.5,0.5]  (rate factor per phase; two windows per phase)
       [--offset-s S]  (each change S seconds into a window instead of on its boundary)
       [--shift-z Z]   (the detector's threshold, retune.shift_z; 0: off)
       [--no-hindsight]  (skip column d)
       [--untimed]  (no wall-clock stop for the edge search: deterministic figures on a loaded machine)
       [--held-out]   (the conversation trace after its first 30 minutes: evaluation only, never
                       for choosing the loop's settings)
The synthetic trace is 1,022 s long: with the default phases it covers 150 s windows
(``--window-s 150``), or 300 s ones with ``--windows-per-phase 1``; a construction the source
cannot fill up to its last window is refused (a partial last window is said).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from retune import TRACES, UNTIMED, run  # noqa: E402  (bench/retune.py: one loop, the live options)

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
    ap.add_argument("--trace", choices=("conversation", "synthetic"), default="conversation")
    ap.add_argument("--no-hindsight", action="store_true", help="skip the best setting in hindsight (column d)")
    ap.add_argument("--held-out", action="store_true",
                    help="the conversation trace after its first 30 minutes (evaluation only: do not tune to it)")
    ap.add_argument("--untimed", action="store_true", help=UNTIMED)
    args = ap.parse_args()
    factors = [float(x) for x in args.phases.split(",")]
    if args.held_out and args.trace != "conversation":
        sys.exit("retune_shift: --held-out is the conversation trace's held-out part; drop --trace synthetic")
    if args.trace == "conversation":
        conv = read_trace(TRACES / "conversation_trace.jsonl.gz").requests
        t0 = min(r.timestamp_ms for r in conv)
        if args.held_out:  # evaluation only
            calib, name = [r for r in conv if r.timestamp_ms >= t0 + 1_800_000], "conversation 1800:end (held out)"
        else:
            calib = [r for r in conv if r.timestamp_ms < t0 + 1_800_000]  # calibration part only
            name = "conversation 0:1800"
    else:
        calib, name = read_trace(TRACES / "synthetic_trace.jsonl").requests, "synthetic"
    reqs = shifted(calib, args.window_s, factors, args.windows_per_phase, args.offset_s)
    span = len(factors) * args.windows_per_phase * args.window_s
    last = max(r.timestamp_ms for r in reqs) / 1000.0
    if last <= span - args.window_s:
        sys.exit(f"retune_shift: the {args.trace} trace fills only {last:.0f} s of the {span:g} s this construction "
                 f"needs; use shorter windows (--window-s) or fewer windows per phase")
    if last < span - args.window_s / 10:
        print(f"note: the {args.trace} trace fills {last:.0f} s of {span:g} s: the last window is partial")
    gains = run(f"{name} re-timed, rate factors {factors} x {args.windows_per_phase} windows"
                + (f", each change {args.offset_s:g} s into a window" if args.offset_s else ""),
                reqs, span, args.window_s, args.workers, args.processes, args.shift_z, not args.no_hindsight,
                not args.untimed)
    # the judged window right after each change: the one it starts (on a boundary) or the next one
    changes = [p * args.windows_per_phase + (1 if args.offset_s else 0) for p in range(1, len(factors))
               if factors[p] != factors[p - 1]]
    after = {w: gains[w] for w in changes if w in gains}
    worst = min(after, key=lambda w: after[w][0]) if after else None
    hind = all(d is not None for _, d in gains.values())
    fmt = lambda g: f"{g[0]:+.1f}%" + (f" / {g[1]:+.1f}%" if g[1] is not None else "")  # noqa: E731
    print(f"mean gain over the best fixed setting{' / over the best in hindsight' if hind else ''}: "
          f"{statistics.fmean(g[0] for g in gains.values()):+.1f}%"
          + (f" / {statistics.fmean(g[1] for g in gains.values()):+.1f}%" if hind else "")
          + "; windows right after a change: " + ", ".join(f"{w} ({fmt(g)})" for w, g in after.items())
          + (f"; worst {worst} ({fmt(after[worst])})" if worst is not None else ""))


if __name__ == "__main__":
    main()
