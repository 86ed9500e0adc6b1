"""Each process exposes Prometheus /metrics: ticks sent per family (beat), task outcomes (workers)."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

from powerfleet.broker.embedded import free_loopback_port
from powerfleet.workers.launcher import Launcher
from tests.waiting import wait_for


def _samples(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_beat_and_worker_expose_powerfleet_metrics(launcher: Launcher) -> None:
    beat_port, worker_port = free_loopback_port(), free_loopback_port()
    launcher.env.update({"POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_NODES": "[]"})
    launcher.env["POWERFLEET_METRICS__PORT"] = str(worker_port)
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@metrics")
    launcher.env["POWERFLEET_METRICS__PORT"] = str(beat_port)
    launcher.spawn("beat", "beat")

    sent = ("powerfleet_ticks_sent_total", (("family", "reconcile"),))
    beat = wait_for(lambda: (s := _samples(beat_port)).get(sent, 0) >= 2 and s, "beat to count two reconcile ticks")
    assert beat[("powerfleet_last_tick_timestamp_seconds", (("family", "reconcile"),))] > 1.7e9

    ok = ("powerfleet_task_outcomes_total", (("outcome", "success"), ("task", "powerfleet.fleet.reconcile")))
    wait_for(lambda: _samples(worker_port).get(ok, 0) >= 1, "the worker to count a successful reconcile tick")
