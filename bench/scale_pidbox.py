"""bench/scale.py: N agents' answers to the fleet's remote-control broadcasts, from one process.

`powerfleet status` and Flower inspect every worker (``active_queues``; Flower also ``stats``,
``registered`` and the rest); each of N real agents answers from its own process. Running N
Celery workers is not possible here, so this process holds one real pidbox node (kombu's) on the
broadcast exchange and, for each broadcast, publishes one reply per simulated agent
``agent@<node>`` through kombu's own reply path, with the payload a real agent's worker gives
(its ``node.<name>`` queue, as Celery's ``Queue.as_dict``). It also keeps each simulated agent's
announcement key (broker/steps.py), so status waits for exactly these N replies, as it would.

    python bench/scale_pidbox.py <broker-url> <node,node,...>
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def queue_dict(app: Any, node: str) -> dict[str, Any]:
    from kombu import Queue

    from powerfleet.queues import node_queue

    return Queue(node_queue(node), routing_key=node_queue(node)).as_dict(recurse=True)


def serve(url: str, nodes: list[str]) -> None:
    import redis

    from powerfleet.broker.steps import ANNOUNCE_EVERY_S, ANNOUNCE_TTL_S, WORKER_KEY
    from powerfleet.config import load_config
    from powerfleet.workers.app import create_app

    app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": url}), with_tasks=False)
    r = redis.Redis.from_url(url)
    replies = {f"agent@{n}": [queue_dict(app, n)] for n in nodes}
    with app.connection_for_write() as conn:
        mailbox = app.control.mailbox(conn)
        channel = conn.default_channel
        node = mailbox.Node("pidbox-sim@scale", channel=channel)

        def on_message(body: dict[str, Any], message: Any) -> None:
            reply_to, ticket = body.get("reply_to"), body.get("ticket")
            if not reply_to or body.get("destination"):
                return  # a cast, or addressed to named workers: agents that are not named stay silent
            method = body.get("method")
            with app.producer_or_acquire() as producer:
                for host, queues in replies.items():
                    answer = queues if method == "active_queues" else {"ok": "pong"} if method == "ping" else {}
                    mailbox._publish_reply({host: answer}, reply_to["exchange"], reply_to["routing_key"], ticket,
                                           producer=producer)

        node.listen(channel, callback=on_message)
        last = 0.0
        while True:
            if time.monotonic() - last > ANNOUNCE_EVERY_S:
                with r.pipeline(transaction=False) as p:
                    for host in replies:
                        p.set(WORKER_KEY + host, "1", ex=ANNOUNCE_TTL_S)
                    p.execute()
                last = time.monotonic()
            try:
                conn.drain_events(timeout=1.0)
            except TimeoutError:
                pass
            except OSError:
                pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2].split(","))
