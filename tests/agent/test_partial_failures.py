"""Fail-safe edges of a pass: a limit the device did not take, and a pass that ran but failed on
one GPU while the state file is unreadable."""

from __future__ import annotations

import pytest

from tests.agent.conftest import Bench


def test_a_limit_the_device_reads_back_differently_is_a_failure_and_not_managed(bench: Bench,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    # The set call returns, but the device keeps its old limit (a driver or another tool overrode it).
    monkeypatch.setattr(bench.gpus, "set_limit", lambda index, milliwatts: None)
    agent = bench.agent()
    g0 = agent.run_pass().gpus[0]
    assert g0.action == "error" and "read back 700" in (g0.error or "") and g0.cap_w is None
    assert "GPU-0000" not in agent.managed  # never recorded as capped by us
    assert bench.metrics.value("powerfleet_agent_apply_failures_total") == 1


def test_a_pass_that_fails_on_one_gpu_keeps_an_unreadable_state_file(bench: Bench) -> None:
    unreadable = '{"managed_uuids": ["GPU-0000"'
    bench.state.dir.mkdir(parents=True)
    bench.state.path.write_text(unreadable)
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(1, [101])

    def gpu0_fails(devs) -> None:
        devs[0].fail = ["read"]
    bench.gpus.update(gpu0_fails)
    agent = bench.agent()
    report = agent.run_pass()
    assert report.skipped is None and not report.good  # it ran; GPU 0 could not be read
    assert report.gpus[1].action == "set"
    assert bench.state.path.read_text() == unreadable  # kept for a human: only a good pass replaces it

    def gpu0_back(devs) -> None:
        devs[0].fail = []
    bench.gpus.update(gpu0_back)
    assert agent.run_pass().good
    assert bench.state.load().uuids == {"GPU-0001"}
