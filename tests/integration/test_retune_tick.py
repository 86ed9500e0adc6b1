"""retune.tick launches each closed window once, even when ticks repeat or its bookkeeping is lost."""

import time

import redis

from powerfleet.retune.windows import dedupe_key, last_closed_window
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker


def test_a_closed_window_is_launched_exactly_once(launcher: Launcher, app, broker_url) -> None:
    launcher.env.update({"POWERFLEET_RETUNE__DEPLOYMENTS": "[llama]", "POWERFLEET_RETUNE__WINDOW_INTERVAL_S": "60"})
    r = redis.Redis.from_url(broker_url)
    r.hset("powerfleet:retune:enabled_at", "llama", repr(time.time() - 3600))  # enabled an hour ago
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@retune")
    wait_worker(app, "ctl@retune")

    first = app.send_task("powerfleet.retune.tick").get(timeout=30)
    second = app.send_task("powerfleet.retune.tick").get(timeout=30)
    r.hdel("powerfleet:retune:last_launched", "llama")  # lose the bookkeeping: the SET NX key still holds
    third = app.send_task("powerfleet.retune.tick").get(timeout=30)

    launched = first["launched"] + second["launched"] + third["launched"]
    expected = last_closed_window(first["at"], 60)
    if last_closed_window(third["at"], 60) == expected:  # no window boundary between the ticks
        assert launched == [{"dgd": "llama", "window": expected.index}]
    assert r.exists(dedupe_key("llama", expected.index))
    assert len({(x["dgd"], x["window"]) for x in launched}) == len(launched)  # never the same window twice
