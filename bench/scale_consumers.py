"""N agents' node-queue consumers, each on its own Redis connection (bench/scale.py ``--light-agents``).

bench/load.py's counting workers are Celery processes consuming 250 node queues each: kombu
re-issues one BRPOP naming all 250 after every message, ~3 ms of CPU a pass, so at 10,000 nodes
the simulation alone needs more than this machine (docs/benchmarks.md, "Scale"). A real agent
consumes one queue. What the fleet shares is Redis, and this plays on Redis exactly what each
agent's consumer does there, one connection per node: ``BRPOP`` on its queue's four priority
keys with kombu's 1 s timeout, re-issued at once; on a message, kombu's QoS bookkeeping (a MULTI
of ZADD ``unacked_index`` and HSET ``unacked``), then its ack (ZREM and HDEL); and a pass counted
as bench/load.py counts it (``HINCRBY`` of its node, or of the expired hash when the message
waited past its ``expires``, which Celery would revoke unrun). The pass itself runs on the node's
own CPU in a real fleet and is not played.

    python bench/scale_consumers.py URL NODE,NODE,...   (spawned by bench/scale.py)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime

PER_NODE = "bench:load:passes"  # bench/load.py's counters: bench/scale.py waits on them
EXPIRED = "bench:load:expired"
BRPOP_TIMEOUT_S = 1  # kombu's redis transport: Channel.brpop_timeout
CONNECTS_AT_ONCE = 256
SEP = "\x06\x16"  # kombu's priority separator; steps 0, 3, 6, 9
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"


def _expired(message: dict, now: float) -> bool:
    expires = (message.get("headers") or {}).get("expires")
    if not expires:
        return False
    at = datetime.fromisoformat(expires)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() < now


async def consume(url: str, node: str, ready: asyncio.Event, counts: list[int], total: int,
                  connecting: asyncio.Semaphore) -> None:
    import redis.asyncio as aioredis

    queue = f"node.{node}"
    keys = [queue, *(f"{queue}{SEP}{p}" for p in (3, 6, 9))]
    r = aioredis.Redis.from_url(url, single_connection_client=True)
    async with connecting:  # a few hundred at a time, as a DaemonSet's agents come up
        await r.ping()
    counts[0] += 1
    if counts[0] == total:
        ready.set()
    while True:
        got = await r.brpop(keys, timeout=BRPOP_TIMEOUT_S)
        if got is None:
            continue
        raw = got[1]
        message = json.loads(raw)
        tag = (message.get("properties") or {}).get("delivery_tag", "")
        await _multi(r, ("ZADD", UNACKED_INDEX, time.time(), tag),  # kombu's QoS.append
                     ("HSET", UNACKED, tag, json.dumps([raw.decode(), "", queue])))
        await r.hincrby(EXPIRED if _expired(message, time.time()) else PER_NODE, node, 1)
        await _multi(r, ("ZREM", UNACKED_INDEX, tag), ("HDEL", UNACKED, tag))  # the ack: _remove_from_indices
        counts[1] += 1


async def _multi(r, *commands: tuple) -> None:
    """MULTI ... EXEC on the consumer's one connection. kombu sends these on a second, pooled
    connection; one per node keeps 10,000 nodes inside this machine's file-descriptor limit
    (Redis's work per command is the same)."""
    await r.execute_command("MULTI")
    for c in commands:
        await r.execute_command(*c)
    await r.execute_command("EXEC")


async def main(url: str, nodes: list[str]) -> None:
    ready, counts = asyncio.Event(), [0, 0]  # connected, passes
    # 5,000 connects at once in one process timed out ("Timeout connecting to server"): more SYNs
    # than Redis's accept backlog (tcp-backlog 511) holds, each dropped one waiting out a retransmit
    connecting = asyncio.Semaphore(CONNECTS_AT_ONCE)
    tasks = [asyncio.create_task(consume(url, n, ready, counts, len(nodes), connecting)) for n in nodes]
    waiting = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if waiting in done:
        print(f"consuming {len(nodes)} node queues", flush=True)  # bench/scale.py waits for this line
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    failed = next(t for t in done if t.exception() is not None)  # a consumer returns only by raising
    print(f"a consumer failed, so this process stops: {type(failed.exception()).__name__}: {failed.exception()}",
          flush=True)
    os._exit(1)  # bench/scale.py notices the process is gone


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
    asyncio.run(main(sys.argv[1], sys.argv[2].split(",")))
