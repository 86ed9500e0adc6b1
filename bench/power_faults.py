"""The guard under sensor faults and dead agents, longer than the test suite runs it (not a test).

    .venv/bin/python bench/power_faults.py [--examples N] [--steps N]

Runs ``powerfleet.testing.power_loop.FaultyGroup`` (the guard and the agent's overlay code in a closed
loop over simulated GPUs: random groups, unreadable, zero and stuck readings, agents that die and
restart; invariant after every step: the guard's figure is never below what the GPUs draw once each
fault has lasted its detection time, and the safe caps fit the limit). Prints the examples and steps
run, the wall time, and the first failure if any; exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import sys
import time
import unittest

from hypothesis import settings

from powerfleet.testing.power_loop import FaultyGroup


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=80)
    args = ap.parse_args()
    FaultyGroup.TestCase.settings = settings(max_examples=args.examples, stateful_step_count=args.steps,
                                             deadline=None, derandomize=False, database=None)
    started = time.monotonic()
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(FaultyGroup.TestCase))
    wall = time.monotonic() - started
    failed = result.failures + result.errors
    print(f"FaultyGroup: up to {args.examples} examples x {args.steps} steps: "
          f"{'FAILED' if failed else 'held'} in {wall:.1f} s")
    for _, trace in failed[:1]:
        print(trace.strip().splitlines()[-1])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
