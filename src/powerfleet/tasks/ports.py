"""Ports the tasks build from their app: Redis for fleet state, the clock."""

from __future__ import annotations

from typing import Any

import redis

from powerfleet.broker.clients import redis_client
from powerfleet.clock import SwitchableClock, SystemClock

_clients: dict[str, redis.Redis] = {}
# Every task reads time here; create_app points it at config.clock_file when that is set.
clock = SwitchableClock(SystemClock())


def fleet_redis(app: Any) -> redis.Redis:
    """One Redis client per process for fleet state (ticks, dedupe keys), on the broker's Redis."""
    url = app.conf.broker_url
    client = _clients.get(url)
    if client is None:
        client = redis_client(url, app.fleet_config.broker, socket_timeout=10, health_check_interval=10)
        _clients[url] = client
    return client
