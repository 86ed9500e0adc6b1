"""Issue 32 item 2: a failing GPU is excluded, not fatal; item 3: uncertain attribution keeps the
cap. Over the simulated driver raising pynvml's own exception classes."""

from __future__ import annotations

import logging

import pytest

from powerfleet.agent.failing import EXCLUDE_AFTER
from powerfleet.agent.runtime import AgentRuntime
from powerfleet.agent.simulated import write_proc_entry
from powerfleet.cluster.dgd import POWER_ANNOTATION
from tests.agent.conftest import Bench


def both_busy(bench: Bench, cap: str = "300") -> None:
    bench.pod("p", cap, pids=(101,))
    bench.set_pids(0, [101])
    bench.set_pids(1, [101])


@pytest.mark.parametrize("fault,kind", [("set_not_supported", "not_supported"), ("gpu_lost", "gpu_lost")])
def test_a_gpu_that_refuses_the_set_or_is_lost_is_excluded_after_a_few_passes_and_retried(
        bench: Bench, caplog, fault: str, kind: str) -> None:
    """Finding 3: one such GPU kept the node NotReady forever, logging on every pass."""
    both_busy(bench)
    bench.gpus.fail(1, fault)
    agent = bench.agent()
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock)
    with caplog.at_level(logging.WARNING, logger="powerfleet.agent"):
        reports = [agent.run_pass() for _ in range(EXCLUDE_AFTER)]
    assert not reports[0].good and reports[-1].good, reports[-1]
    g1 = reports[-1].gpus[1]
    assert (g1.action, g1.error_kind, g1.excluded) == ("error", kind, True), g1
    assert bench.limits() == [300, 700]  # the other GPU stays enforced
    ready, detail = rt.readiness()
    assert ready and f"({kind})" in detail, detail
    assert sum("retried every pass" in m for m in caplog.messages) == 1, caplog.messages
    key = "GPU-0001" if kind == "not_supported" else "index 1"  # a lost GPU cannot even tell its UUID
    labels = {"gpu": "1", "UUID": key, "Hostname": "node-a", "kind": kind}
    assert bench.metrics.value("powerfleet_agent_gpu_excluded", labels) == 1
    bench.gpus.fail(1)  # the GPU comes back: the next pass caps it
    report = agent.run_pass()
    assert report.good and not report.gpus[1].excluded and bench.limits() == [300, 300], report.gpus[1]
    assert bench.metrics.registry.get_sample_value("powerfleet_agent_gpu_excluded", labels) is None


def test_a_gpu_failing_for_a_configuration_reason_is_never_excluded(bench: Bench) -> None:
    both_busy(bench)
    bench.gpus.fail(1, "no_permission")
    agent = bench.agent()
    reports = [agent.run_pass() for _ in range(EXCLUDE_AFTER + 1)]
    assert not reports[-1].good and not reports[-1].gpus[1].excluded, reports[-1]


def test_a_malformed_driver_value_stays_on_its_gpu(bench: Bench) -> None:
    """Finding 8: a TypeError (not an NVML error) from one GPU aborted the whole pass."""
    both_busy(bench)
    bench.gpus.fail(0, "malformed")
    report = bench.agent().run_pass()
    g0, g1 = report.gpus
    assert (g0.action, g0.error_kind) == ("error", "malformed") and "malformed value" in (g0.error or ""), g0
    assert g1.cap_w == 300 and bench.limits() == [700, 300], g1


def test_a_bug_in_one_gpus_work_is_confined_to_it(bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    from powerfleet.agent import reconcile

    both_busy(bench)
    real = reconcile.card_range

    def broken_for_gpu0(min_mw, max_mw, name):
        if bench.gpus.sets == [] and not getattr(broken_for_gpu0, "done", False):
            broken_for_gpu0.done = True
            raise KeyError("a bug")
        return real(min_mw, max_mw, name)
    monkeypatch.setattr(reconcile, "card_range", broken_for_gpu0)
    report = bench.agent().run_pass()
    g0, g1 = report.gpus
    assert (g0.action, g0.error_kind) == ("error", "internal"), g0
    assert g1.cap_w == 300 and bench.limits() == [700, 300], g1


def test_an_unattributed_process_beside_an_opted_in_pod_keeps_the_current_cap(bench: Bench) -> None:
    """Finding 4: a PID that just exited took a 600 W pod to the safe default."""
    bench.pod("p", "600", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    assert agent.run_pass().gpus[0].cap_w == 600
    bench.set_pids(0, [101, 555])  # 555 exited: NVML lists it, /proc has nothing: it counts for nobody
    g0 = agent.run_pass().gpus[0]
    assert (g0.decision, g0.cap_w, g0.unattributed) == ("single", 600, 0) and bench.limits()[0] == 600, g0
    write_proc_entry(bench.proc, 555, None)  # a host process beside it: uncertainty, the cap is kept
    g0 = agent.run_pass().gpus[0]
    assert (g0.decision, g0.cap_w, g0.unattributed) == ("conflict", 600, 1) and bench.limits()[0] == 600, g0
    bench.pods[0].annotations[POWER_ANNOTATION] = "400"  # a valid value still lowers it
    assert agent.run_pass().gpus[0].cap_w == 400 and bench.limits()[0] == 400


def test_an_unsupported_gpus_series_goes_when_it_reads_again_or_vanishes(bench: Bench) -> None:
    """Finding 8: a vanished GPU's metric series stayed."""
    both_busy(bench)
    bench.gpus.fail(1, "not_supported")
    agent = bench.agent()
    agent.run_pass()
    labels = {"gpu": "1", "UUID": "GPU-0001", "Hostname": "node-a"}
    assert bench.metrics.value("powerfleet_agent_gpu_power_limit_unsupported", labels) == 1
    bench.gpus.fail(1)
    agent.run_pass()
    assert bench.metrics.registry.get_sample_value("powerfleet_agent_gpu_power_limit_unsupported", labels) is None
    bench.gpus.fail(1, "not_supported")
    agent.run_pass()
    bench.gpus.update(lambda devs: devs.pop())  # GPU 1 is gone from the node
    agent.run_pass()
    assert bench.metrics.registry.get_sample_value("powerfleet_agent_gpu_power_limit_unsupported", labels) is None


def test_persistence_mode_is_reported_per_gpu_and_in_the_readiness_detail(bench: Bench, caplog) -> None:
    """Issue 32 item 7: with persistence mode off a limit may not outlive the agent's NVML handle."""
    both_busy(bench)

    def off(devs) -> None:
        devs[1].persistence = False
    bench.gpus.update(off)
    agent = bench.agent()
    rt = AgentRuntime(agent, interval_s=60, clock=bench.clock)
    with caplog.at_level(logging.WARNING, logger="powerfleet.agent"):
        agent.run_pass()
        agent.run_pass()
    assert sum("persistence mode is off" in m for m in caplog.messages) == 1, caplog.messages
    for gpu, value in (("0", 1), ("1", 0)):
        labels = {"gpu": gpu, "UUID": f"GPU-000{gpu}", "Hostname": "node-a"}
        assert bench.metrics.value("powerfleet_agent_gpu_persistence_mode", labels) == value
    ready, detail = rt.readiness()
    assert ready and "persistence_off=GPU-0001" in detail, detail
