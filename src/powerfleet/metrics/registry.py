"""The metric families (all named powerfleet_*) and the /metrics server."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client import multiprocess

TICKS_SENT = Counter("powerfleet_ticks_sent_total", "Beat ticks published, per tick family", ["family"])
LAST_TICK = Gauge("powerfleet_last_tick_timestamp_seconds", "Epoch time of the last tick published, per family",
                  ["family"], multiprocess_mode="max")
TASK_OUTCOMES = Counter("powerfleet_task_outcomes_total", "Finished tasks by task name and outcome",
                        ["task", "outcome"])


def serve_metrics(port: int, address: str) -> None:
    """Expose /metrics; in multiprocess mode aggregate every child's values."""
    if port == 0:
        return
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        start_http_server(port, addr=address, registry=registry)
    else:
        start_http_server(port, addr=address)
