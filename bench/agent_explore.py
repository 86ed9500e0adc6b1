"""The node agent's caps state machine (issue 32), run long: random seeds, many examples.

``make test`` runs it bounded and derandomized (tests/agent/test_caps_machine.py); this runs
``--examples`` fresh random examples of ``--steps`` steps each and prints how many ran, how long
they took, and the first failure (shrunk) if any. Exit 1 on a failure.

    PYTHONPATH=src python bench/agent_explore.py --examples 500 --steps 40
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from powerfleet.testing.agent_machine import CapsMachine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)  # the agent's own lines, thousands of them, say nothing here
    t0 = time.monotonic()
    try:
        run_state_machine_as_test(CapsMachine, settings=settings(
            max_examples=args.examples, stateful_step_count=args.steps, deadline=None, database=None,
            suppress_health_check=list(HealthCheck)))
    except BaseException as exc:  # hypothesis raises the (shrunk) failure, or an ExceptionGroup of them
        print(f"FAILED after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: {str(exc)[:2000]}")
        return 1
    print(f"caps machine: {args.examples} examples x up to {args.steps} steps, no invariant broken, "
          f"{time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
