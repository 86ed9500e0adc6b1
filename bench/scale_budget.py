"""bench/scale.py part (e): the budget tick at scale, as bench/budget.py measures it.

1,000 deployments (``deployments``) in 50 racks over ``nodes`` nodes, their replicas scaled so
the cluster holds about 8 GPU pods per node (one GPU each): 8,000 pods at 1,000 nodes, 80,000 at
10,000. The loopback API server and the client run in this one process, so the CPU seconds
include the server's.
"""

from __future__ import annotations

import time
from typing import Any, Callable


def budget_size(nodes: int, deployments: int, say: Callable[[str], None]) -> dict[str, Any]:
    from bench.budget import bench_api_tick

    scale = max(1, round(8 * nodes / (4 * deployments)))  # bench/budget.py's fleet averages 4 pods each
    t0 = time.perf_counter()
    got = bench_api_tick(deployments, nodes, 50, 7, batched=True, scale=scale)
    got["bench_wall_s"] = time.perf_counter() - t0
    got["deployments"], got["scale"] = deployments, scale
    say(f"  budget: {got['pods']} pods; tick reads {got['tick_s']:.2f} s ({got['tick_cpu_s']:.2f} CPU s), "
        f"{got['tick_calls']} calls, {got['tick_bytes'] / 1e6:.1f} MB; scaling tick's evaluations "
        f"{got['first']['wall_s']:.1f} s, {got['first']['calls']} calls")
    return got
