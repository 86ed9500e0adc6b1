"""The metric families (all named powerfleet_*) and the /metrics server."""

from __future__ import annotations

import glob
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client import multiprocess

TICKS_SENT = Counter("powerfleet_ticks_sent_total", "Beat ticks published, per tick family", ["family"])
LAST_TICK = Gauge("powerfleet_last_tick_timestamp_seconds", "Epoch time of the last tick published, per family",
                  ["family"], multiprocess_mode="max")
TASK_OUTCOMES = Counter("powerfleet_task_outcomes_total", "Finished tasks by task name and outcome",
                        ["task", "outcome"])


class SettledFilesCollector(multiprocess.MultiProcessCollector):
    """The children's values, from the files that have their header written.

    A child creates its ``*.db`` file empty and only then writes its 8-byte header; a scrape that
    lands in between made prometheus_client's reader raise ``struct.error`` and the whole /metrics
    answer a 500 (seen in a loaded CI run, right as a pool child started). Such a file holds no
    value yet, so leaving it out until its header is there loses nothing.
    """

    def collect(self):  # type: ignore[no-untyped-def] - prometheus_client's own signature
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(path) >= 8:
                    files.append(path)
            except OSError:  # removed as the child exited: nothing to read
                continue
        return self.merge(files, accumulate=True)


def serve_metrics(port: int, address: str) -> None:
    """Expose /metrics; in multiprocess mode aggregate every child's values."""
    if port == 0:
        return
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        SettledFilesCollector(registry)
        start_http_server(port, addr=address, registry=registry)
    else:
        start_http_server(port, addr=address)
