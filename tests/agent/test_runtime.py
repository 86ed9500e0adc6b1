"""Passes never overlap, a busy tick waits then defers (never lost), the watch is never lost, the local timer,
readiness."""

from __future__ import annotations

import threading

from powerfleet.agent.runtime import STALE_INTERVALS, AgentRuntime
from powerfleet.cluster.dgd import POWER_ANNOTATION
from tests.agent.conftest import Bench
from tests.waiting import wait_for


def passes(bench: Bench, trigger: str, outcome: str = "ok") -> float:
    return bench.metrics.value("powerfleet_agent_passes_total", {"trigger": trigger, "outcome": outcome})


def _held_pass(bench: Bench):
    """An agent whose first pod listing blocks until released (a pass in flight), later ones do not."""
    release, entered, calls = threading.Event(), threading.Event(), []
    real = bench.list_pods

    def list_once_slow():
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            release.wait(10)
        return real()
    agent = bench.agent()
    agent._list_pods = list_once_slow
    return agent, release, entered, calls


def _tick_behind(rt: AgentRuntime, holder, entered: threading.Event, release: threading.Event) -> list:
    """Run `holder` until it holds the pass lock, send a tick, then let the holder finish: what
    the tick returned."""
    first = threading.Thread(target=holder)
    first.start()
    assert entered.wait(10)
    got: list = []
    tick = threading.Thread(target=lambda: got.append(rt.tick_pass()))
    tick.start()
    assert not got  # still waiting on the lock
    release.set()
    first.join(10)
    tick.join(10)
    return got


def test_a_tick_arriving_while_a_short_pass_runs_waits_for_it_and_runs_its_own_pass(bench: Bench) -> None:
    agent, release, entered, calls = _held_pass(bench)
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock, tick_wait_s=30)
    got = _tick_behind(rt, rt.tick_pass, entered, release)
    assert got and got[0] is not None, got  # its own pass, after the first
    assert len(calls) == 2 and passes(bench, "tick") == 2 and passes(bench, "tick", "deferred") == 0


def test_a_tick_held_past_its_wait_is_deferred_and_the_pass_thread_runs_it_once_the_lock_is_free(bench: Bench) -> None:
    agent, release, entered, calls = _held_pass(bench)
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock, tick_wait_s=0.05).start()
    try:
        first = threading.Thread(target=rt.tick_pass)
        first.start()
        assert entered.wait(10)
        assert rt.tick_pass() is None  # deferred, not run here
        assert rt.tick_pass() is None  # a second one coalesces with it
        assert passes(bench, "tick", "deferred") == 2 and len(calls) == 1
        release.set()
        first.join(10)
        wait_for(lambda: passes(bench, "tick") == 2, "the deferred tick's pass on the pass thread")
        assert len(calls) == 2 and passes(bench, "watch") == 0
        assert rt.last_watch_reason == "a deferred tick"
    finally:
        rt.stop()


def test_a_process_poll_holding_the_lock_never_costs_a_tick_its_pass(bench: Bench) -> None:
    """The route of the flaky end-to-end test: the poll's look at the GPUs holds the pass lock
    for a moment; a tick arriving then used to be dropped with no pass at all."""
    entered, release = threading.Event(), threading.Event()
    agent = bench.agent()
    real = agent.processes_changed

    def slow_look() -> bool:
        entered.set()
        release.wait(10)
        return real()
    agent.processes_changed = slow_look
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock, tick_wait_s=30)
    got = _tick_behind(rt, rt._processes_changed, entered, release)
    assert got and got[0] is not None and passes(bench, "tick") == 1, (got, passes(bench, "tick", "deferred"))


def test_a_watch_request_during_a_pass_gets_its_own_pass_afterwards(bench: Bench) -> None:
    release = threading.Event()
    entered = threading.Event()
    real = bench.list_pods
    calls = []

    def list_once_slow():
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            release.wait(10)
        return real()
    agent = bench.agent()
    agent._list_pods = list_once_slow
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock).start()
    try:
        tick = threading.Thread(target=rt.tick_pass)
        tick.start()
        assert entered.wait(10)
        rt.request_pass("pod default/p modified")
        rt.request_pass("pod default/q modified")  # coalesced with the first
        release.set()
        tick.join(10)
        wait_for(lambda: passes(bench, "watch") == 1, "the watch pass after the tick pass")
        assert len(calls) == 2
    finally:
        rt.stop()


def test_without_ticks_for_three_intervals_passes_run_on_a_local_timer_until_ticks_resume(bench: Bench) -> None:
    rt = AgentRuntime(bench.agent(), interval_s=0.05, clock=bench.clock).start()
    try:
        bench.clock.advance(0.05 * (STALE_INTERVALS - 1))
        rt.request_pass("probe")  # a pass through the loop, proving it is awake
        wait_for(lambda: passes(bench, "watch") == 1, "the loop to run")
        assert passes(bench, "timer") == 0  # two intervals without a tick: not yet
        bench.clock.advance(0.051)  # now past three intervals
        wait_for(lambda: passes(bench, "timer") >= 2, "timer passes")
        rt.tick_pass()
        n = passes(bench, "timer")
        rt.request_pass("probe")
        wait_for(lambda: passes(bench, "watch") == 2, "the loop to run again")
        assert passes(bench, "timer") == n  # the tick switched the timer off
    finally:
        rt.stop()


def test_readiness_follows_the_age_of_the_last_good_pass(bench: Bench) -> None:
    rt = AgentRuntime(bench.agent(), interval_s=15, clock=bench.clock)
    assert rt.readiness() == (False, "not-ready: no good pass yet")
    rt.tick_pass()
    assert rt.readiness()[0]
    bench.clock.advance(45)
    assert rt.readiness()[0]
    bench.clock.advance(1)
    ok, text = rt.readiness()
    assert not ok and "last good pass 46.0s ago" in text
    bench.list_error = RuntimeError("apiserver down")
    rt.tick_pass()
    assert not rt.readiness()[0]  # a skipped pass is not a good pass
    assert bench.metrics.value("powerfleet_agent_last_good_pass_age_seconds") == 46.0


def test_stop_keeps_the_caps_and_a_drain_restores_them(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    rt = AgentRuntime(bench.agent(), interval_s=60, clock=bench.clock).start()
    rt.tick_pass()
    rt.stop()
    rt.stop()  # idempotent
    assert bench.limits()[0] == 300 and bench.state.load().uuids == {"GPU-0000"}  # the next agent adopts it
    rt = AgentRuntime(bench.agent(), interval_s=60, clock=bench.clock).start()
    rt.drain()
    assert bench.limits()[0] == 700 and bench.state.load().uuids == frozenset()
    assert rt.tick_pass().skipped == "drained: caps are at their defaults until the drain is undone"
    assert bench.limits()[0] == 700
    rt.stop()


def test_no_tick_pass_runs_after_the_stop(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    rt = AgentRuntime(bench.agent(), interval_s=60, clock=bench.clock).start()
    rt.tick_pass()
    assert bench.limits()[0] == 300
    rt.stop()
    bench.pods[0].annotations[POWER_ANNOTATION] = "250"
    assert rt.tick_pass() is None  # a message already received when SIGTERM came
    assert bench.limits()[0] == 300


def test_a_new_process_on_a_gpu_gets_a_pass_from_the_poll_before_any_tick(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    rt = AgentRuntime(bench.agent(), interval_s=3600, clock=bench.clock, poll_s=0.01).start()
    try:
        rt.tick_pass()  # the GPUs are idle: nothing to cap
        assert bench.limits() == [700, 700]
        bench.set_pids(1, [101])  # the pod's first process starts on GPU 1
        wait_for(lambda: bench.limits() == [700, 300], "the poll's pass to cap GPU 1")
        wait_for(lambda: passes(bench, "process") == 1, "the pass to be counted")  # after its last write
    finally:
        rt.stop()


def test_a_blind_proc_root_fails_readiness_at_once_with_its_reason(bench: Bench, tmp_path) -> None:
    agent = bench.agent()
    agent.proc_root = tmp_path / "nonexistent"
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock)
    agent.start()  # the proc-root check runs at start
    ok, text = rt.readiness()
    assert not ok and text.startswith("not-ready: proc root") and "hostPID" in text


def test_a_stop_while_a_pass_hangs_keeps_the_node_lock_until_it_returns(bench: Bench) -> None:
    """Issue 32 item 7: after a hung call the lock went, and a successor could cap beside the pass."""
    import pytest

    from powerfleet.agent.lock import LocalLock, LockHeld

    release, entered = threading.Event(), threading.Event()
    real = bench.list_pods

    def hung():
        entered.set()
        release.wait(30)
        return real()
    agent = bench.agent()
    agent._list_pods = hung
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock)
    rt.local_lock = LocalLock(bench.tmp / "node-a.lock", "node-a").acquire()
    pass_thread = threading.Thread(target=rt.tick_pass)
    pass_thread.start()
    assert entered.wait(10)
    rt.stop(timeout_s=0.2)
    with pytest.raises(LockHeld):
        LocalLock(bench.tmp / "node-a.lock", "node-a").acquire()
    release.set()
    pass_thread.join(10)
    rt.local_lock.release()  # the process exiting would drop it
