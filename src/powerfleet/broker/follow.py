"""Move this process's Redis connections to a new master as soon as the Sentinels announce it.

redis-py only leaves a master when that master tells it to (READONLY once it is a replica).
After a graceful ``SENTINEL FAILOVER`` the old master keeps accepting writes until Sentinel
demotes it, about ten seconds later, and every write of those seconds (queued ticks, tick
records, fan-in counters) is dropped when it resyncs from the new master (docs/reliability.md
"Broker failover"). So each process listens for Sentinel's ``+switch-master`` and then closes
the idle connections of its Sentinel-managed pools; the next command of each client resolves
the master again, through the Sentinels, and reaches the new one. (A blocked read, such as a
worker's BRPOP, stays on the old master until its demotion: it only reads.)
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import redis

from powerfleet.broker.clients import sentinel_kwargs
from powerfleet.config.broker_urls import is_sentinel, parse_sentinel_url
from powerfleet.config.fleet import BrokerConfig

logger = logging.getLogger("powerfleet.broker")
_proxies: "weakref.WeakSet[Any]" = weakref.WeakSet()
_listener: "SwitchListener | None" = None
_lock = threading.Lock()


def track(proxy: Any) -> None:
    """Remember a Sentinel pool's proxy (redis-py), so a switch can close its pool's connections."""
    _proxies.add(proxy)


def drop_connections(new_master: tuple[str, int] | None = None) -> int:
    """Close the idle connections of every tracked pool; how many pools.

    Idle ones only, as redis-py itself does on a master change: closing a connection another
    thread is reading (a worker's BRPOP, registered with its event loop) from here crashed the
    worker. ``new_master``: the address Sentinel announced, recorded as each master pool's
    master, so a connection in use now (a publisher's, mid-command) is closed when it is handed
    back instead of returning to the pool still on the old master (redis-py keeps only
    connections to the pool's master address); a publisher at 400/s otherwise kept writing to
    the old master until its demotion, as if it had not followed the switch at all.
    """
    pools = []
    for proxy in list(_proxies):
        pool = proxy.connection_pool_ref()
        if pool is None:
            continue
        if new_master is not None and getattr(proxy, "is_master", False):
            proxy.master_address = new_master
        pools.append(pool)
    for pool in pools:
        try:
            pool.disconnect(inuse_connections=False)
        except (redis.RedisError, OSError):  # a socket already gone: nothing to close
            pass
    return len(pools)


class SwitchListener(threading.Thread):
    """Subscribes to ``+switch-master`` on one Sentinel at a time (the next when one fails)."""

    def __init__(self, url: str, broker: BrokerConfig) -> None:
        super().__init__(name="powerfleet-sentinel-switch", daemon=True)
        self.sentinels = parse_sentinel_url(url).sentinels
        self.master_name = broker.sentinel.master_name
        self.kwargs = sentinel_kwargs(broker.sentinel)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for host, port in self.sentinels:
                if self.stopped.is_set():
                    return
                self._listen(host, port)
            self.stopped.wait(1.0)  # every Sentinel unreachable: try again shortly

    def _listen(self, host: str, port: int) -> None:
        client = redis.Redis(host=host, port=port, **self.kwargs)
        try:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe("+switch-master")
            while not self.stopped.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is None:
                    continue
                data = message.get("data")
                fields = (data.decode(errors="replace") if isinstance(data, bytes) else str(data)).split()
                if fields and fields[0] == self.master_name:
                    new = (fields[3], int(fields[4])) if len(fields) >= 5 and fields[4].isdigit() else None
                    pools = drop_connections(new)
                    logger.warning("broker: Sentinel switched master %s to %s; reconnecting %d pools",
                                   self.master_name, ":".join(fields[3:5]), pools)
        except (redis.RedisError, OSError):
            return  # this Sentinel is gone: the caller moves to the next
        finally:
            client.close()


def follow_switches(url: str, broker: BrokerConfig) -> None:
    """Start this process's listener (once; none for a plain Redis URL)."""
    global _listener
    if not is_sentinel(url) or broker.sentinel.master_name is None:
        return
    with _lock:
        if _listener is None or not _listener.is_alive():
            _listener = SwitchListener(url, broker)
            _listener.start()
