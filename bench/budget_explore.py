"""The seeded exploration of the budget's state space, run longer than ``make test`` does (issue 30
item 3): the state machine of src/powerfleet/testing/budget/explore_machine.py over the real tick and evaluation code,
the loopback API server and a real (embedded) Redis, which a step restarts. Prints the examples and steps run, the rounds
judged, the replica writes, the late evaluation messages run (each skipped: its tick was no longer the
newest), the longest run, and any counterexample (hypothesis prints its steps; exit 1).

    python bench/budget_explore.py [--examples 200] [--steps 60] [--seed 30]
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from powerfleet.broker.embedded import EmbeddedRedis  # noqa: E402
from powerfleet.testing.budget.explore_machine import STATS, explore  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=30)
    args = ap.parse_args()
    t0 = time.monotonic()
    with EmbeddedRedis() as server:
        try:
            stats = explore(server.url, examples=args.examples, steps=args.steps, seed=args.seed,
                            restart=server.restart)
        except Exception as exc:  # noqa: BLE001 - an AssertionError, or hypothesis's group of distinct ones
            print("".join(traceback.format_exception(exc))[-8000:])
            print(f"counterexample after {STATS['examples']} examples, {STATS['steps']} steps (its steps above)")
            return 1
    print(f"budget exploration (seed {args.seed}): {stats['examples']} examples, {stats['steps']} steps "
          f"({stats['rounds_judged']} rounds judged, {stats['writes']} replica writes, {stats['late']} late messages "
          f"skipped, {stats['restarts']} redis-server restarts), longest run {stats['longest']} steps, no counterexample, "
          f"{time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
