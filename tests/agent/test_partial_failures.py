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
    monkeypatch.setattr(bench.gpus, "set_limit", lambda index, milliwatts, uuid=None: None)
    agent = bench.agent()
    g0 = agent.run_pass().gpus[0]
    assert g0.action == "error" and "read back 700" in (g0.error or "") and g0.cap_w is None
    assert "GPU-0000" not in agent.managed  # never recorded as capped by us
    assert bench.metrics.value("powerfleet_agent_apply_failures_total") == 1


def test_a_corrupt_state_file_is_kept_aside_and_rebuilt_at_once_though_one_gpu_fails(bench: Bench) -> None:
    """Issue 32 finding 5: a corrupt record was rewritten only after a good pass, so with one
    failing GPU no new cap was ever recorded."""
    unreadable = '{"managed_uuids": ["GPU-0000"'
    bench.state.dir.mkdir(parents=True)
    bench.state.path.write_text(unreadable)
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(1, [101])
    bench.gpus.fail(0, "read")
    agent = bench.agent()
    report = agent.run_pass()
    assert report.skipped is None and not report.good, report  # it ran; GPU 0 could not be read
    assert report.gpus[1].action == "set", report.gpus[1]
    assert bench.state.load().uuids == {"GPU-0001"}  # the new cap is recorded at once
    assert (bench.state.dir / "managed_gpus.json.corrupt").read_text() == unreadable  # kept for a human
    bench.gpus.fail(0)
    assert agent.run_pass().good
    assert bench.state.load().uuids == {"GPU-0001"}
