"""``powerfleet_broker_reconnects_total``: each process's reconnects to the broker.

Created on first use, not at import: a prefork worker must set PROMETHEUS_MULTIPROC_DIR before
prometheus_client creates any metric (powerfleet.metrics), and the CLI imports this module too.
Processes call ``reconnects()`` once at start-up so the series is there, at 0, before any outage.
"""

from __future__ import annotations

from typing import Any

_counter: Any = None


def reconnects() -> Any:
    global _counter
    if _counter is None:
        from prometheus_client import Counter

        _counter = Counter("powerfleet_broker_reconnects_total",
                           "Times this process connected to the broker again after losing it (outage, failover)")
    return _counter
