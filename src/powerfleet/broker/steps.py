"""What every worker process (control, sweep, agent) does about its broker connection.

* Counts reconnects: Celery's consumer restarts its bootsteps each time it connects again
  after losing the broker (an outage, a Sentinel failover), so a consumer step's second and
  later starts are reconnects: ``powerfleet_broker_reconnects_total``.
* Announces itself: a key per worker with a TTL, refreshed while it is connected, so
  `powerfleet status` knows how many workers to wait for and answers as soon as they all have,
  instead of waiting out its whole timeout for workers that might exist.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import bootsteps

from powerfleet.broker.clients import redis_client
from powerfleet.broker.follow import follow_switches
from powerfleet.broker.metrics import reconnects

logger = logging.getLogger("powerfleet.broker")
WORKER_KEY = "powerfleet:worker:"
ANNOUNCE_EVERY_S = 5.0
ANNOUNCE_TTL_S = 15  # three missed refreshes: the worker is gone (or cut off from Redis)


def live_workers(r: redis.Redis) -> set[str]:
    """Worker names with a live announcement (SCAN, never KEYS)."""
    found = set()
    for key in r.scan_iter(match=WORKER_KEY + "*", count=500):
        name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        found.add(name[len(WORKER_KEY):])
    return found


class BrokerWatch(bootsteps.StartStopStep):
    """A consumer step: started on every (re)connection, stopped when the connection goes."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self._starts = 0
        self._timer: Any = None
        self._client: redis.Redis | None = None
        self._warned = False
        reconnects()  # the series exists, at 0, from the start
        follow_switches(c.app.conf.broker_url, c.app.fleet_config.broker)

    def start(self, c: Any) -> None:
        self._starts += 1
        if self._starts > 1:
            reconnects().labels(kind="consumer").inc()
            logger.warning("broker: %s reconnected (%d reconnects since start)", c.hostname, self._starts - 1)
        if self._client is None:
            self._client = redis_client(c.app.conf.broker_url, c.app.fleet_config.broker,
                                        socket_timeout=2, socket_connect_timeout=2)
        self._announce(c)
        self._timer = c.timer.call_repeatedly(ANNOUNCE_EVERY_S, self._announce, (c,))

    def _announce(self, c: Any) -> None:
        assert self._client is not None
        try:
            self._client.set(WORKER_KEY + c.hostname, "1", ex=ANNOUNCE_TTL_S)
            self._warned = False
        except (redis.RedisError, OSError) as exc:
            if not self._warned:  # one line per outage; the consumer reports the outage itself
                logger.warning("broker: could not announce %s (%s)", c.hostname, str(exc).splitlines()[0][:200])
                self._warned = True

    def stop(self, c: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        if self._client is not None:
            try:
                self._client.delete(WORKER_KEY + c.hostname)
            except (redis.RedisError, OSError):
                pass  # the key expires on its own
            self._client.close()


def follow_in_pool_children(app: Any) -> None:
    """Prefork children run most tasks (and their writes): each follows switches too."""
    from celery import signals

    from powerfleet.broker.metrics import watch_sentinel_pools

    watch_sentinel_pools()

    def start(**_: Any) -> None:
        follow_switches(app.conf.broker_url, app.fleet_config.broker)

    signals.worker_process_init.connect(start, weak=False)

