"""A window after the newest closed one is refused (send time and task), and the window
record can be reset by the operator (issue 21 item 1)."""

from __future__ import annotations

import pytest

from powerfleet.clock import FakeClock
from powerfleet.config.fleet import FleetConfig
from powerfleet.retune import control, live
from powerfleet.retune.context import Deployment
from powerfleet.retune.settings import SettingsError, dgd_overrides
from powerfleet.tasks.base import TaskInputError
from powerfleet.tasks.retune import WindowArgs
from powerfleet.workers.app import create_app
from tests.retune.conftest import make_ports, retune_config
from powerfleet.testing.retune_world import start_of

K = 29_000_200


def test_the_send_time_check_refuses_a_window_that_has_not_closed() -> None:
    app = create_app(FleetConfig.model_validate({"retune": {"window_interval_s": 300}}), "redis://127.0.0.1:1/0")
    closed = int(__import__("time").time() // 300) - 1
    app.check_send("powerfleet.retune.window", None, {"dgd": "llm-agg", "window": closed}, task_api=True)
    for k in (closed + 1, closed + 100, 99999999999999999999):
        with pytest.raises(TaskInputError, match="has not closed yet"):
            app.check_send("powerfleet.retune.window", None, {"dgd": "llm-agg", "window": k}, task_api=True)


def test_the_argument_model_bounds_the_window_by_the_deployments_own_schedule() -> None:
    cfg = FleetConfig.model_validate({"retune": {"window_interval_s": 300,
                                                 "per_deployment": {"fast": {"window_interval_s": 60}}}})
    now = 600_000.0  # window 1999 of 300 s has closed; window 9999 of 60 s has closed
    ctx = {"config": cfg, "now": now}
    assert WindowArgs.model_validate({"dgd": "slow", "window": 1999}, context=ctx).window == 1999
    with pytest.raises(ValueError, match="newest closed window is 1999"):
        WindowArgs.model_validate({"dgd": "slow", "window": 2000}, context=ctx)
    assert WindowArgs.model_validate({"dgd": "fast", "window": 9999}, context=ctx).window == 9999
    with pytest.raises(ValueError, match="newest closed window is 9999"):
        WindowArgs.model_validate({"dgd": "fast", "window": 10000}, context=ctx)


def test_a_dgd_annotation_cannot_move_the_window_schedule() -> None:
    with pytest.raises(SettingsError, match="set in the fleet config"):
        dgd_overrides({"powerfleet.nvidia.com/retune": '{"window_interval_s": 10}'})


def test_the_task_refuses_a_future_window_and_reset_repairs_a_poisoned_record(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    clock = FakeClock(start_of(K) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    ports.r.flushdb()
    assert control.tick_deployment(cfg, ports, "llama", clock.now())["status"] == "leader"
    out = live.launch_window(cfg, ports, "llama", K + 5)  # the domain step refuses it too
    assert out["status"] == "refused" and "has not closed yet" in out["reason"]
    dep = Deployment.open(cfg, ports, "llama")
    assert dep.store.read()[0].last_window is None  # nothing recorded
    # A record poisoned before the bound existed: every real window would be "already decided".
    t, _, _ = dep.leadership.claim()
    dep.store.update(t, lambda s: s.model_copy(update={"last_window": 99999999999999999999}))
    assert live.launch_window(cfg, ports, "llama", K - 1)["status"] == "already-decided"
    reset = control.reset_window(cfg, ports, "llama")
    assert (reset["status"], reset["last_window"], reset["newest_closed"]) == ("reset", None, K - 1)
    assert dep.store.read()[0].last_window is None
    assert live.launch_window(cfg, ports, "llama", K - 1)["status"] == "no-traffic"  # decided again, once
    assert control.reset_window(cfg, ports, "llama")["status"] == "unchanged"
    standby = make_ports(redis_url, kube, "ctl-b", FakeClock(start_of(K) + 1, 1.0))
    assert control.reset_window(cfg, standby, "llama")["status"] == "not-leader"


def test_a_tick_now_far_ahead_of_the_clock_is_refused_at_send_time() -> None:
    app = create_app(FleetConfig.model_validate({}), "redis://127.0.0.1:1/0")
    now = __import__("time").time()
    app.check_send("powerfleet.retune.tick", None, {"now": now - 3600}, task_api=True)  # a replay of the past
    with pytest.raises(TaskInputError, match="ahead of the clock"):
        app.check_send("powerfleet.retune.tick", None, {"now": now + 86400 * 365}, task_api=True)
