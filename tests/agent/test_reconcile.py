"""One pass over simulated GPUs, a fake /proc and a pod list: what it sets, and what it never does."""

from __future__ import annotations

import logging

import pytest

from powerfleet.cluster.ports import ClusterError
from tests.agent.conftest import Bench


def test_single_pod_cap_is_set_read_back_and_recorded_as_managed(bench: Bench, caplog) -> None:
    bench.pod("llama-decode-0", "350", pids=(101, 102))
    bench.set_pids(0, [101, 102])
    agent = bench.agent()
    with caplog.at_level(logging.INFO, logger="powerfleet.agent"):
        report = agent.run_pass()
    g0, g1 = report.gpus
    assert (g0.decision, g0.requested_w, g0.cap_w, g0.action) == ("single", 350, 350, "set")
    assert (g1.decision, g1.cap_w, g1.action) == ("idle", None, "none")
    assert bench.limits() == [350, 700]
    assert bench.state.load().uuids == {"GPU-0000"}
    assert "GPU 0 (GPU-0000): 700 W -> 350 W (single)" in caplog.text
    assert bench.metrics.value("powerfleet_agent_applied_limit_watts", {"gpu": "0"}) == 350
    assert report.good and agent.last_good_mono == bench.clock.monotonic()


def test_a_set_that_already_holds_is_not_repeated(bench: Bench) -> None:
    bench.pod("p", "350", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent.run_pass()
    agent.run_pass()
    report = agent.run_pass()
    assert bench.gpus.sets == [(0, 350_000)]
    assert report.gpus[0].action == "hold"


@pytest.mark.parametrize("cap,expected,direction", [("50", 200, "min"), ("900", 700, "max"), ("200", 200, None)])
def test_caps_are_clamped_to_the_device_range_and_counted_by_direction(bench: Bench, cap, expected, direction) -> None:
    bench.pod("p", cap, pids=(101,))
    bench.set_pids(0, [101])
    g = bench.agent().run_pass().gpus[0]
    assert (g.requested_w, g.cap_w, g.clamped) == (int(cap), expected, direction)
    assert bench.limits()[0] == expected
    for d in ("min", "max"):
        assert bench.metrics.value("powerfleet_agent_cap_clamped_total", {"direction": d}) == (1 if d == direction else 0)


def test_conflicting_pods_get_the_lowest_valid_cap_and_agreeing_ones_their_cap(bench: Bench) -> None:
    bench.pod("a", "300", pids=(101,))
    bench.pod("b", "350", pids=(102,))
    bench.pod("c", "300", pids=(201,))
    bench.pod("d", "300", pids=(202, 203))
    bench.set_pids(0, [101, 102])
    bench.set_pids(1, [201, 202, 203])
    g0, g1 = bench.agent().run_pass().gpus
    assert (g0.decision, g0.cap_w, len(g0.pods)) == ("conflict", 300, 2)  # never above a cap involved
    assert (g1.decision, g1.cap_w, len(g1.pods)) == ("agree", 300, 2)  # d's two processes count once
    assert bench.metrics.value("powerfleet_agent_multi_pod_gpu_total", {"disposition": "conflict"}) == 1
    assert bench.metrics.value("powerfleet_agent_multi_pod_gpu_total", {"disposition": "agree"}) == 1
    assert bench.metrics.value("powerfleet_agent_safe_default_applied_total") == 0  # two valid values: the lowest, no safe default


def test_pod_list_failure_changes_nothing_and_is_counted(bench: Bench, caplog) -> None:
    bench.pod("p", "350", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent.run_pass()
    bench.pods[0] = bench.pods[0].model_copy(update={"annotations": {"dynamo.nvidia.com/gpu-power-limit": "250"}})
    bench.set_pids(1, [101])
    bench.list_error = ClusterError("list pods: HTTP 503 Service Unavailable", status=503)
    report = agent.run_pass()
    assert report.skipped == "pod list failed: list pods: HTTP 503 Service Unavailable"
    assert report.gpus == []
    assert bench.limits() == [350, 700] and bench.gpus.sets == [(0, 350_000)]
    assert bench.metrics.value("powerfleet_agent_pod_list_failures_total") == 1
    assert not report.good
    with caplog.at_level(logging.INFO, logger="powerfleet.agent"):
        agent.run_pass()
        agent.run_pass()
        bench.list_error = None
        assert agent.run_pass().good
    assert bench.metrics.value("powerfleet_agent_pod_list_failures_total") == 3  # counted every pass
    assert sum("pass skipped" in m for m in caplog.messages) == 1  # one warning for three skipped passes
    assert any("passes run again" in m for m in caplog.messages)


def test_one_gpu_failing_never_stops_the_others(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    bench.set_pids(1, [101])

    def break_gpu0(devs) -> None:
        devs[0].fail = ["set"]
    bench.gpus.update(break_gpu0)
    agent = bench.agent()
    report = agent.run_pass()
    g0, g1 = report.gpus
    assert g0.action == "error" and "Unknown Error" in (g0.error or "") and g0.cap_w is None
    assert (g1.action, g1.cap_w) == ("set", 300)
    assert agent.managed == {"GPU-0001"}  # managed only after a successful set
    assert bench.metrics.value("powerfleet_agent_apply_failures_total") == 1

    def unreadable_gpu0(devs) -> None:
        devs[0].fail = ["read"]
    bench.gpus.update(unreadable_gpu0)
    g0, g1 = agent.run_pass().gpus
    assert g0.decision is None and g0.action == "error" and g1.action == "hold"


def test_readback_mismatch_is_a_failure_and_not_managed(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])

    def no_readback(devs) -> None:
        devs[0].fail = ["readback"]
    bench.gpus.update(no_readback)
    agent = bench.agent()
    g0 = agent.run_pass().gpus[0]
    assert g0.action == "error" and "GPU-0000" not in agent.managed


def test_idle_gpu_keeps_its_cap_and_a_managed_gpu_without_opted_in_pods_is_restored(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.pod("plain", None, pids=(301,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent.run_pass()
    bench.set_pids(0, [])  # the worker exits for a moment
    assert agent.run_pass().gpus[0].decision == "idle"
    assert bench.limits()[0] == 300 and agent.managed == {"GPU-0000"}
    bench.set_pids(0, [301])  # a pod without the annotation takes the GPU
    g0 = agent.run_pass().gpus[0]
    assert (g0.decision, g0.requested_w, g0.cap_w, g0.action) == ("release", 700, 700, "set")
    assert bench.limits()[0] == 700 and agent.managed == set()
    assert bench.state.load().uuids == frozenset()


def test_release_leaves_a_gpu_it_does_not_manage_alone(bench: Bench) -> None:
    bench.pod("plain", None, pids=(301,))

    def someone_elses_cap(devs) -> None:
        devs[1].current_w = 450
        devs[1].pids = [301]
    bench.gpus.update(someone_elses_cap)
    g1 = bench.agent().run_pass().gpus[1]
    assert (g1.decision, g1.cap_w, g1.action) == ("release", None, "none")
    assert bench.limits()[1] == 450 and bench.gpus.sets == []


def test_dry_run_touches_nothing(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    report = agent.run_pass(dry_run=True)
    assert (report.gpus[0].cap_w, report.gpus[0].action) == (300, "would-set")
    assert bench.gpus.sets == [] and not bench.state.path.exists()
    assert bench.metrics.value("powerfleet_agent_passes_total", {"trigger": "tick", "outcome": "ok"}) == 0


def test_gpu_backend_unavailable_skips_the_pass_and_is_retried(bench: Bench) -> None:
    from powerfleet.agent.gpu import GpuError

    calls = []

    def broken():
        calls.append(1)
        raise GpuError("NVML init failed: Driver Not Loaded")
    agent = bench.agent()
    agent._open_gpus = broken
    assert agent.run_pass().skipped == "GPU backend: NVML init failed: Driver Not Loaded"
    agent.run_pass()
    assert len(calls) == 2
