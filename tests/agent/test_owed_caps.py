"""Issue 32 item 6: fail-closed at boot. An agent whose node lock cannot be taken because Redis is
down (a real client against a port nobody listens on) still applies the caps its state owes,
from the pod view or the last persisted one, and decides nothing new."""

from __future__ import annotations

import socket

import redis

from powerfleet.agent.build import take_lock
from powerfleet.agent.lock import LocalLock
from powerfleet.agent.runtime import AgentRuntime
from tests.agent.conftest import Bench


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rebooted(bench: Bench) -> None:
    def defaults(devs) -> None:
        for d in devs:
            d.current_w = d.default_w
    bench.gpus.update(defaults)


def booted_without_redis(bench: Bench, *, local: bool = True) -> AgentRuntime:
    rt = AgentRuntime(bench.agent(), interval_s=60, clock=bench.clock)
    down = redis.Redis(port=closed_port(), socket_connect_timeout=1, socket_timeout=1)
    rt.lock = take_lock(down, "node-a", 60)
    if local:
        rt.local_lock = LocalLock(bench.tmp / "node-a.lock", "node-a").acquire()
    return rt


def test_a_node_rebooted_while_redis_is_down_gets_the_caps_its_state_owes(bench: Bench) -> None:
    """Finding 7: every pass was skipped, so after a reboot no cap was in force for the outage."""
    bench.pod("p", "300", pids=(101,))
    bench.pod("new", "250", pids=(202,))
    bench.set_pids(0, [101])
    bench.agent().run_pass()
    assert bench.limits() == [300, 700]
    rebooted(bench)
    bench.set_pids(1, [202])  # a new pod: a new decision, which needs the lock
    rt = booted_without_redis(bench)
    rt.agent.start()  # at start, not three intervals later on the local timer (Redis down: no ticks)
    assert bench.limits() == [300, 700], rt.agent.last_report
    rebooted(bench)
    report = rt.tick_pass()
    assert report is not None and "caps the state owes" in (report.skipped or ""), report
    assert bench.limits() == [300, 700], report
    bench.list_error = RuntimeError("apiserver down too")  # the persisted owners answer for the pod view
    rebooted(bench)
    rt.tick_pass()
    assert bench.limits() == [300, 700]
    ready, detail = rt.readiness()
    assert not ready, detail


def test_an_owed_cap_whose_pod_is_gone_from_the_view_is_not_applied(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    bench.agent().run_pass()
    rebooted(bench)
    bench.pods.clear()
    booted_without_redis(bench).tick_pass()
    assert bench.limits() == [700, 700]


def test_without_the_node_local_lock_nothing_is_applied(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    bench.agent().run_pass()
    rebooted(bench)
    report = booted_without_redis(bench, local=False).tick_pass()
    assert report is not None and report.skipped and bench.limits() == [700, 700], report
