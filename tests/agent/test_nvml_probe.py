"""bench/nvml_probe.py: every read and its outcome per GPU, and nothing that could set a limit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from powerfleet.agent.simnvml import SimulatedNvml
from powerfleet.agent.simulated import SimulatedGpus
from tests.agent.conftest import device

SPEC = importlib.util.spec_from_file_location("nvml_probe", Path(__file__).resolve().parents[2] / "bench" / "nvml_probe.py")
assert SPEC is not None and SPEC.loader is not None
nvml_probe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(nvml_probe)


def test_the_probe_reports_each_call_and_its_outcome_and_sets_nothing(tmp_path: Path) -> None:
    gpus = SimulatedGpus.shared(tmp_path / "gpus.json", [device(0, pids=[5], draw_w=300.5, fail=["library_mismatch"]),
                                                         device(1, fail=["not_supported"])])
    out = nvml_probe.probe(SimulatedNvml(gpus))
    g0, g1 = out["gpus"]
    assert g0["uuid"]["value"] == "GPU-0000" and g0["draw_mw"]["value"] == 300_500
    assert g0["compute_processes"]["kind"] == "library_mismatch"
    assert g0["compute_processes_v2"]["value"] == [{"pid": 5, "used_memory": 1 << 30}]
    assert g0["mps_processes"]["value"] == []
    assert g1["limit_mw"]["kind"] == "not_supported" and g1["uuid"]["outcome"] == "ok"
    assert gpus.sets == []
    json.dumps(out)


def test_the_probe_lists_each_mig_slot_of_a_gpu_in_mig_mode(tmp_path: Path) -> None:
    gpus = SimulatedGpus.shared(tmp_path / "gpus.json", [device(0, mig=["MIG-a", "MIG-b"]), device(1)])
    g0, g1 = nvml_probe.probe(SimulatedNvml(gpus))["gpus"]
    assert g0["mig_mode"]["value"] == [1, 1] and g0["max_mig_devices"]["value"] == 7
    assert [m["uuid"]["value"] for m in g0["mig_devices"] if "uuid" in m] == ["MIG-a", "MIG-b"]
    empty = g0["mig_devices"][2:]  # slots 2..6: NVML_ERROR_NOT_FOUND
    assert len(empty) == 5 and all("NotFound" in m["handle"]["error"] for m in empty)
    assert g1["mig_mode"]["kind"] == "not_supported" and g1["mig_devices"] == []


def test_the_probe_cannot_reach_a_call_that_changes_the_device() -> None:
    ro = nvml_probe.ReadOnly(SimulatedNvml(SimulatedGpus([device(0)])))
    for name in ("nvmlDeviceSetPowerManagementLimit", "nvmlDeviceResetGpuLockedClocks", "nvmlDeviceClearEccErrorCounts"):
        with pytest.raises(AttributeError, match="read-only"):
            getattr(ro, name)
