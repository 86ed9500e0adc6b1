"""The first pass of bench/agent.py (c) (8 GPUs, 200 processes, 25 pods, 8 caps set), measured
so that other processes' load does not drown it: the pass's own CPU time (``time.thread_time``),
its wall time, and its fsyncs (count and wall), medians over --nodes fresh nodes.

    .venv/bin/python bench/agent_first.py [--nodes 12] [--tree DIR]

``--tree`` measures another checkout's code with this harness (its ``src`` on the path first:
``git archive <commit> src bench | tar -x -C DIR``), to compare versions interleaved on the
same machine. Prints one JSON line and the load average it ran under.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def measure(tree: Path, nodes: int) -> dict[str, Any]:
    sys.path[:0] = [str(tree / "src"), str(tree / "bench"), str(tree)]
    import agent as bench_agent  # the tree's own bench/agent.py (its node setup)
    import powerfleet.agent.reconcile as reconcile

    fsync = {"n": 0, "s": 0.0}
    real_fsync = os.fsync

    def counted_fsync(fd: int) -> None:
        t = time.perf_counter()
        real_fsync(fd)
        fsync["s"] += time.perf_counter() - t
        fsync["n"] += 1

    os.fsync = counted_fsync
    first: list[tuple[float, float, int, float]] = []
    run_pass = reconcile.NodeAgent.run_pass

    def timed(self: Any, *args: Any, **kw: Any) -> Any:
        if vars(self).get("_bench_timed"):
            return run_pass(self, *args, **kw)
        self._bench_timed = True
        fsync["n"], fsync["s"] = 0, 0.0
        cpu, wall = time.thread_time(), time.perf_counter()
        out = run_pass(self, *args, **kw)
        first.append(((time.thread_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000, fsync["n"],
                      fsync["s"] * 1000))
        return out

    reconcile.NodeAgent.run_pass = timed  # type: ignore[method-assign]
    for _ in range(nodes):
        bench_agent.bench_pass(2)

    def med(i: int) -> float:
        return round(statistics.median(x[i] for x in first), 1)
    return {"nodes": nodes, "first_cpu_ms": med(0), "first_wall_ms": med(1), "fsyncs": med(2),
            "fsync_wall_ms": med(3), "load_average": round(os.getloadavg()[0], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    a = ap.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the agent logs every cap it sets
    print(json.dumps(measure(a.tree.resolve(), a.nodes)))


if __name__ == "__main__":
    main()
