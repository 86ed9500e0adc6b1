"""bench/scale.py part (s): the reconcile tick's send side alone, in this process.

N live agents (bench/scale.py's ``seed_agents``), then ``ticks`` runs of the real
``powerfleet.fleet.reconcile`` through ``Task.apply`` on a fresh app (so the first one is a
worker's first tick: nothing declared, no connection warm), each one's node messages dropped
afterwards as consumers would take them. Printed: CPU and wall seconds per tick, the nodes
reached, and kombu binding keys left in Redis.
"""

from __future__ import annotations

import time
from typing import Any, Callable


def send_ticks(nodes: int, ticks: int, say: Callable[[str], None]) -> list[dict[str, Any]]:
    import redis

    from bench.scale import loadavg, seed_agents
    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.config import load_config
    from powerfleet.workers.app import create_app

    names = [f"n{i:05d}" for i in range(nodes)]
    out: list[dict[str, Any]] = []
    with EmbeddedRedis() as server:
        app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": server.url}))
        r = redis.Redis.from_url(server.url)
        task = app.tasks["powerfleet.fleet.reconcile"]
        for k in range(ticks):
            seed_agents(r, names)
            c0, t0 = time.process_time(), time.perf_counter()
            res = task.apply(kwargs={})
            got = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0, "state": res.state,
                   "count": (res.result or {}).get("count") if res.successful() else None,
                   "bindings": sum(1 for _ in r.scan_iter("_kombu.binding.*", count=1000)), "load": loadavg()}
            out.append(got)
            say(f"  send tick {k + 1}/{ticks}: {got['cpu_s']:.2f} CPU s, {got['wall_s']:.2f} s wall, {got['state']}, "
                f"{got['count']} nodes, {got['bindings']} binding keys, load {got['load']}")
            with r.pipeline(transaction=False) as p:
                for n in names:
                    p.delete(f"node.{n}")
                p.execute()
    return out
