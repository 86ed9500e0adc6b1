"""The guard's periods and messages slipping, longer than the test suite runs it (not a test).

    .venv/bin/python bench/power_slip.py [--seeds 200] [--seconds 300]

Runs ``powerfleet.testing.power_loop.slipping`` (the guard and the agent's overlay code in a closed loop
over simulated GPUs, 8 x 700 W at 1.3x, random demand every second) with a share of the guard's periods
not running (30, 50, 70 %) and every overlay a second late, against the same seeds without the slip.
Prints, per share: seconds over the limit with and without the slip, the longest run over, the seeds
where the slip added a second, and the wall time; exits 1 if the slip added any.
"""

from __future__ import annotations

import argparse
import time

from powerfleet.testing.power_loop import longest_run, slipping


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--seconds", type=int, default=300)
    args = ap.parse_args()
    worse = 0
    for skip in (0.3, 0.5, 0.7):
        t = time.perf_counter()
        on_time = slipped = longest = 0
        added = []
        for seed in range(args.seeds):
            a, b = slipping(seed, skip, 0, args.seconds), slipping(seed, skip, 1, args.seconds)
            on_time, slipped, longest = on_time + len(a), slipped + len(b), max(longest, longest_run(b))
            if len(b) > len(a) or longest_run(b) > 1:
                added.append(seed)
        worse += len(added)
        print(f"guard periods skipped {skip:.0%}, messages 1 s late: {slipped} s over the limit (on time: "
              f"{on_time} s) in {args.seeds} x {args.seconds} s; longest run {longest} s; seeds worse: "
              f"{added[:10] or 'none'}; {time.perf_counter() - t:.1f} s")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
