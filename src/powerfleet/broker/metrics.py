"""``powerfleet_broker_reconnects_total{kind}``: each process's reconnects to the broker.

* ``kind="consumer"``: Celery's consumer lost the broker and connected again (an outage, a
  killed master); counted by powerfleet.broker.steps.
* ``kind="master_changed"``: a Sentinel-managed connection pool of this process found a new
  master and moved its connections there (a failover, graceful or not). redis-py does this
  inside the pool, so Celery never sees a lost connection; counted once per new master per
  process, however many pools (broker, results, RedBeat, fleet state) noticed it.

Created on first use, not at import: a prefork worker must set PROMETHEUS_MULTIPROC_DIR before
prometheus_client creates any metric (powerfleet.metrics), and the CLI imports this module too.
Processes call ``reconnects()`` once at start-up so the series are there, at 0, before any outage.
"""

from __future__ import annotations

import threading
from typing import Any

from redis.sentinel import SentinelConnectionPoolProxy

from powerfleet.broker.follow import track

_counter: Any = None
_lock = threading.Lock()
_masters: dict[str, Any] = {}  # service name -> the master address this process last used


def reconnects() -> Any:
    global _counter
    with _lock:
        if _counter is None:
            from prometheus_client import Counter

            _counter = Counter("powerfleet_broker_reconnects_total",
                               "Times this process reconnected to the broker: consumer (lost it and connected "
                               "again), master_changed (followed a Sentinel failover)", ["kind"])
            for kind in ("consumer", "master_changed"):
                _counter.labels(kind=kind)
    watch_sentinel_pools()
    return _counter


def master_seen(service: str, address: Any) -> bool:
    """Record the master a pool of this process resolved; True when it is a new one."""
    with _lock:
        before = _masters.get(service)
        _masters[service] = address
    return before is not None and before != address


def watch_sentinel_pools() -> None:
    """Hook redis-py's Sentinel pools (once per process): count master changes, and track the
    pools so powerfleet.broker.follow can move them when Sentinel announces a switch."""
    # Connections ask their pool's proxy (redis-py 8), not the pool itself.
    original = SentinelConnectionPoolProxy.get_master_address
    if getattr(original, "_powerfleet", False):
        return

    def get_master_address(self: SentinelConnectionPoolProxy) -> Any:
        track(self)
        address = original(self)
        if master_seen(self.service_name, address) and _counter is not None:
            _counter.labels(kind="master_changed").inc()
        return address

    get_master_address._powerfleet = True  # type: ignore[attr-defined]
    SentinelConnectionPoolProxy.get_master_address = get_master_address  # type: ignore[method-assign]
