"""Startup orphan recovery, inconclusive state, and the shutdown restore."""

from __future__ import annotations

import logging

from powerfleet.agent.gpu import GpuError
from tests.agent.conftest import Bench


def capped(bench: Bench, index: int, watts: float, pids: list[int] | None = None) -> None:
    def change(devs) -> None:
        devs[index].current_w = watts
        devs[index].pids = pids or []
    bench.gpus.update(change)


def test_idle_orphans_are_restored_busy_ones_wait_and_absent_ones_are_dropped(bench: Bench) -> None:
    bench.state.save({"GPU-0000", "GPU-0001", "GPU-gone"})
    capped(bench, 0, 300)
    capped(bench, 1, 300, pids=[101])
    agent = bench.agent()
    agent.start()
    assert bench.limits() == [700, 300]
    assert agent.managed == {"GPU-0001"}
    assert bench.state.load().uuids == {"GPU-0001"}


def test_absent_uuids_are_kept_when_the_scan_is_incomplete(bench: Bench) -> None:
    bench.state.save({"GPU-0000", "GPU-gone"})
    capped(bench, 0, 300)

    def unreadable(devs) -> None:
        devs[1].fail = ["read"]
    bench.gpus.update(unreadable)
    agent = bench.agent()
    agent.start()
    assert agent.managed == {"GPU-gone"}  # GPU 1 could not be read: GPU-gone may be it
    assert bench.limits()[0] == 700


def test_a_corrupt_record_is_rebuilt_from_the_limits_so_no_cap_outlives_its_owner(bench: Bench, caplog) -> None:
    """Issue 32 finding 5: a GPU below its default with no usable record is taken as managed; an
    idle one whose pods are gone (none here) goes back to its default at start."""
    bench.state.dir.mkdir(parents=True)
    bench.state.path.write_text('{"managed_uuids": ["GPU-0000"')
    capped(bench, 0, 300)
    with caplog.at_level(logging.ERROR, logger="powerfleet.agent"):
        agent = bench.agent()
        agent.start()
        agent.run_pass()
    assert "state record lost" in caplog.text
    assert bench.limits() == [700, 700] and agent.managed == set()
    assert bench.state.load().conclusive and bench.state.load().uuids == frozenset()


def test_a_missing_record_in_an_existing_state_directory_is_rebuilt_too(bench: Bench) -> None:
    bench.state.dir.mkdir(parents=True)  # an agent ran here; its file is gone
    bench.pod("p", "300")  # no process: the 300 W GPU has no owner the agent can find
    capped(bench, 1, 300)
    agent = bench.agent()
    agent.start()
    agent.run_pass()
    assert bench.limits() == [700, 700], agent.last_report


def test_shutdown_leaves_the_caps_for_the_next_agent(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent.run_pass()
    agent.shutdown()
    assert bench.limits() == [300, 700] and bench.state.load().uuids == {"GPU-0000"}
    successor = bench.agent()  # a restarted agent adopts the managed set and keeps the cap
    successor.start()
    assert successor.managed == {"GPU-0000"} and bench.limits() == [300, 700]
    assert successor.run_pass().gpus[0].action == "hold" and bench.gpus.sets == [(0, 300_000)]


def test_a_drained_shutdown_restores_every_managed_gpu_persists_then_closes(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    bench.set_pids(1, [101])
    agent = bench.agent()
    agent.run_pass()
    assert bench.limits() == [300, 300]
    order = []
    real_close = bench.gpus.close
    bench.gpus.close = lambda: (order.append(("close", list(bench.limits()))), real_close())[1]
    agent.shutdown(restore=True)
    assert bench.limits() == [700, 700]
    assert order == [("close", [700, 700])]  # restored before the backend was closed
    assert bench.state.load().uuids == frozenset()


def test_shutdown_with_no_managed_gpu_does_nothing(bench: Bench, caplog) -> None:
    agent = bench.agent()
    agent.shutdown(restore=True)
    assert bench.gpus.sets == [] and bench.opened == 0
    assert not bench.state.path.exists()


def test_shutdown_never_raises_and_logs_failures_with_their_traceback(bench: Bench, caplog) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    bench.set_pids(1, [101])
    agent = bench.agent()
    agent.run_pass()

    def broken_set(devs) -> None:
        devs[0].fail = ["set"]
    bench.gpus.update(broken_set)

    def close_fails() -> None:
        raise GpuError("NVML shutdown: Uninitialized")
    bench.gpus.close = close_fails
    with caplog.at_level(logging.ERROR, logger="powerfleet.agent"):
        agent.shutdown(restore=True)  # must not raise
    assert bench.limits() == [300, 700]  # GPU 1 restored although GPU 0 failed
    assert agent.managed == {"GPU-0000"} and bench.state.load().uuids == {"GPU-0000"}
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert any("restoring the default limit failed" in r.getMessage() for r in tracebacks)
    assert any("closing the GPU backend failed" in r.getMessage() for r in tracebacks)
