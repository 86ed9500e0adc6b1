"""A pass over the simulated driver's failure modes (simnvml.py, pynvml's own exception classes):
no exception escapes a GPU, blind spots keep caps, and the safe default is safe on the card."""

from __future__ import annotations

import logging
from pathlib import Path

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from tests.agent.conftest import Bench, device


def busy(bench: Bench, cap: str | None, *gpus: int, pid: int = 101) -> str:
    uid = bench.pod(f"p{pid}", cap, pids=(pid,))
    for i in gpus:
        bench.set_pids(i, [pid])
    return uid


def test_a_driver_without_the_v3_process_call_still_gets_its_gpus_capped(bench: Bench) -> None:
    busy(bench, "300", 0, 1)
    bench.gpus.fail(0, "library_mismatch")  # NVMLLibraryMismatchError from the process list
    report = bench.agent().run_pass()
    assert [g.cap_w for g in report.gpus] == [300, 300] and report.good
    assert bench.limits() == [300, 300]


def test_each_failure_stays_on_its_gpu_and_is_counted_by_kind(bench: Bench) -> None:
    bench.gpus = SimulatedGpus([device(i) for i in range(4)])
    busy(bench, "300", 0, 1, 2, 3)
    bench.gpus.fail(0, "gpu_lost")
    bench.gpus.fail(1, "no_permission")
    report = bench.agent().run_pass()
    g0, g1, g2, g3 = report.gpus
    assert (g0.action, g0.error_kind) == ("error", "gpu_lost")
    assert (g1.action, g1.error_kind, g1.write, g1.enforced_w) == ("error", "no_permission", "failed", None)
    assert [g2.cap_w, g3.cap_w] == [300, 300] and bench.limits()[2:] == [300, 300]
    assert not report.good
    for kind in ("gpu_lost", "no_permission"):
        assert bench.metrics.value("powerfleet_agent_gpu_errors_total", {"kind": kind}) == 1


def test_a_gpu_without_power_limit_support_is_reported_once_and_left_out_of_readiness(bench: Bench, caplog) -> None:
    busy(bench, "300", 0, 1)
    bench.gpus.fail(1, "not_supported")
    agent = bench.agent()
    with caplog.at_level(logging.WARNING, logger="powerfleet.agent"):
        first, second = agent.run_pass(), agent.run_pass()
    assert second.gpus[1].action == "unsupported" and second.gpus[1].uuid == "GPU-0001"
    assert first.good and second.good  # every GPU that can be capped is enforced
    assert bench.limits() == [300, 700]
    assert sum("no power-limit support" in m for m in caplog.messages) == 1
    assert bench.metrics.value("powerfleet_agent_gpu_power_limit_unsupported",
                               {"gpu": "1", "UUID": "GPU-0001", "Hostname": "node-a"}) == 1


def test_a_driver_reload_is_survived_by_re_initialising(bench: Bench) -> None:
    busy(bench, "300", 0)
    agent = bench.agent()
    agent.run_pass()
    bench.gpus.fail(0, "uninitialized")
    assert agent.run_pass().good and bench.limits()[0] == 300


def test_a_proc_root_that_shows_nothing_keeps_every_cap_and_fails_readiness(bench: Bench, tmp_path: Path) -> None:
    busy(bench, "300", 0)
    agent = bench.agent()
    agent.run_pass()
    assert bench.limits()[0] == 300
    bench.pods[0].annotations.clear()  # the pod stops asking: a seeing agent would release
    agent.proc_root = tmp_path / "nonexistent"
    report = agent.run_pass()
    assert report.blind and "cannot be listed" in report.blind and not report.good
    assert report.gpus[0].decision == "hold" and bench.limits()[0] == 300 and agent.managed == {"GPU-0000"}


def test_a_proc_root_without_the_gpu_processes_is_a_blind_spot(bench: Bench) -> None:
    bench.set_pids(0, [4242])  # NVML sees it; the proc root (another PID namespace) does not
    report = bench.agent().run_pass()
    assert report.blind and "shows none of the 1 GPU process" in report.blind and not report.good


def test_a_vanished_process_counts_for_nobody_and_a_host_process_for_an_unknown_owner(bench: Bench) -> None:
    busy(bench, "300", 0)
    agent = bench.agent()
    agent.run_pass()
    bench.set_pids(0, [101, 555])  # 555 exited; NVML still lists it, /proc has nothing
    bench.pods[0].annotations.clear()  # the pod stops asking
    g0 = agent.run_pass().gpus[0]
    assert (g0.decision, g0.unattributed) == ("release", 0) and bench.limits()[0] == 700, g0
    write_proc_entry(bench.proc, 555, None, program="/usr/bin/nv-hostengine")  # now a live host process
    g0 = agent.run_pass().gpus[0]
    assert (g0.decision, g0.unattributed, g0.cap_w) == ("safe_default", 1, 500) and bench.limits()[0] == 500, g0


def test_the_safe_default_is_below_the_maximum_of_the_card(bench: Bench) -> None:
    bench.gpus = SimulatedGpus([device(0, min_w=100, max_w=350, default_w=350, current_w=350, name="NVIDIA L40S")])
    bench.safe_default = 500  # the chart's value: no cap at all on an L40S
    busy(bench, "lots", 0)
    g0 = bench.agent().run_pass().gpus[0]
    assert (g0.decision, g0.cap_w) == ("safe_default", 245) and bench.limits() == [245]


def test_an_external_limit_change_is_detected_counted_and_corrected_next_pass(bench: Bench) -> None:
    busy(bench, "300", 0)
    agent = bench.agent()
    agent.run_pass()

    def nvidia_smi_pl(devs) -> None:
        devs[0].current_w = 650
    bench.gpus.update(nvidia_smi_pl)
    g0 = agent.run_pass().gpus[0]
    assert (g0.action, g0.cap_w) == ("set", 300) and bench.limits()[0] == 300
    assert bench.metrics.value("powerfleet_agent_readback_mismatch_total") == 1


def test_an_out_of_band_limit_below_the_target_is_reported_as_the_enforced_cap(bench: Bench) -> None:
    bench.gpus = SimulatedGpus([device(0, enforced_w=250)])
    busy(bench, "300", 0)
    g0 = bench.agent().run_pass().gpus[0]
    assert (g0.cap_w, g0.enforced_w, g0.write, g0.readback) == (300, 250, "ok", "match")
    assert bench.metrics.value("powerfleet_agent_enforced_below_target_total") == 1


def test_the_measured_draw_is_reported_in_watts(bench: Bench) -> None:
    bench.gpus = SimulatedGpus([device(0, draw_w=612.5)])
    bench.agent().run_pass()
    assert bench.metrics.value("powerfleet_agent_power_draw_watts", {"gpu": "0"}) == 612.5


def test_per_gpu_series_carry_dcgm_labels_and_go_with_their_gpu(bench: Bench) -> None:
    bench.pod("decode-0", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent.run_pass()
    labels = {"gpu": "0", "UUID": "GPU-0000", "Hostname": "node-a", "namespace": "default", "pod": "decode-0",
              "container": ""}
    for name in ("requested", "target", "enforced"):
        assert bench.metrics.value(f"powerfleet_agent_gpu_power_limit_{name}_watts", labels) == 300
    assert bench.metrics.value("powerfleet_agent_gpu_power_limit_readback_timestamp_seconds", labels) == bench.clock.now()
    idle = {"gpu": "1", "UUID": "GPU-0001", "Hostname": "node-a", "namespace": "", "pod": "", "container": ""}
    assert bench.metrics.value("powerfleet_agent_gpu_power_limit_enforced_watts", idle) == 700
    assert bench.metrics.registry.get_sample_value("powerfleet_agent_gpu_power_limit_target_watts", idle) is None
    bench.gpus.update(lambda devs: devs.pop())  # GPU 1 is gone from the node
    agent.run_pass()
    assert bench.metrics.registry.get_sample_value("powerfleet_agent_gpu_power_limit_enforced_watts", idle) is None
    assert bench.metrics.registry.get_sample_value("powerfleet_agent_applied_limit_watts", {"gpu": "1"}) is None
    assert bench.metrics.value("powerfleet_agent_gpu_power_limit_enforced_watts", labels) == 300


def test_a_containers_own_proc_root_is_a_blind_spot(bench: Bench) -> None:
    """Issue 32 item 7: a container-only /proc (its PID 1 in a pod's cgroup) was taken for the host's."""
    uid = busy(bench, "300", 0)
    write_proc_entry(bench.proc, 1, uid)  # PID 1 is the container's entrypoint, not the host's init
    report = bench.agent().run_pass()
    assert report.blind and "is a container's" in report.blind and not report.good, report
