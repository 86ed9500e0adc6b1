"""Queue depths of every fleet queue, node.* included, read straight from Redis.

Flower's Broker page and `celery inspect` only know queues that a live worker consumes, so a
task for a node no agent serves would sit in ``node.<name>`` unseen. Kombu keeps each Redis
queue as a list named after it; a SCAN over ``node.*`` finds every one of them.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import redis

from powerfleet.broker.clients import redis_client
from powerfleet.config import BrokerConfig
from powerfleet.queues import CONTROL_QUEUE, NODE_QUEUE_PREFIX, SWEEP_QUEUE, is_fleet_queue


def queue_depths(r: redis.Redis, also: Iterable[str] = ()) -> dict[str, int]:
    """Depth of control, sweep, every node.* list in Redis, and ``also`` (e.g. consumed queues)."""
    names = {CONTROL_QUEUE, SWEEP_QUEUE, *(q for q in also if is_fleet_queue(q))}
    for key in r.scan_iter(match=NODE_QUEUE_PREFIX + "*", count=1000, _type="list"):
        name = key.decode() if isinstance(key, bytes) else str(key)
        if is_fleet_queue(name):
            names.add(name)
    ordered = sorted(names)
    with r.pipeline(transaction=False) as p:
        for q in ordered:
            p.llen(q)
        return dict(zip(ordered, (int(n) for n in p.execute())))


class QueueDepthCollector:
    """``powerfleet_queue_depth{queue}``, read from Redis at scrape time (one SCAN + pipelined LLEN)."""

    def __init__(self, url: str, broker: BrokerConfig | None = None) -> None:
        self._r = redis_client(url, broker or BrokerConfig(), socket_timeout=2, socket_connect_timeout=2)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("powerfleet_queue_depth", "Messages waiting per fleet queue (node.* included)",
                                   labels=["queue"])
        try:
            depths = queue_depths(self._r)
        except (redis.RedisError, OSError):
            depths = {}  # broker down: no samples rather than a failed scrape
        for q, n in depths.items():
            family.add_metric([q], n)
        yield family
