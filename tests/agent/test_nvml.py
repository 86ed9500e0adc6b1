"""The NVML backend against stand-in pynvml modules raising pynvml's own exception classes (a
minimal one here, the simulated driver of simnvml.py for the failure modes); the read path
against a real GPU where one exists."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pynvml
import pytest
from pynvml import NVMLError

from powerfleet.agent.gpu import GpuError, normalise_uuid
from powerfleet.agent.nvml import NvmlBackend
from powerfleet.agent.simulated import SimulatedGpus
from tests.agent.conftest import device


class FakeNvml:
    """Just the pynvml calls the backend makes, over a list of dict devices (mW)."""

    NVMLError = NVMLError

    def __init__(self, devices: list[dict], *, uuid_bytes: bool = False) -> None:
        self.devices = devices
        self.uuid_bytes = uuid_bytes
        self.calls: list[str] = []
        self.broken: dict[tuple[int, str], int] = {}  # (gpu, call) -> NVML error code
        self.shutdown_error: int | None = None

    def _dev(self, h: int, fn: str) -> dict:
        self.calls.append(fn)
        if (h, fn) in self.broken:
            raise NVMLError(self.broken[(h, fn)])
        return self.devices[h]

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        if self.shutdown_error:
            raise NVMLError(self.shutdown_error)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < len(self.devices):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetUUID(self, h: int):
        u = self._dev(h, "uuid")["uuid"]
        return u.encode() if self.uuid_bytes else u

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int):
        d = self._dev(h, "constraints")
        return d["min"], d["max"]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return self._dev(h, "default")["default"]

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return self._dev(h, "limit")["limit"]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int):
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self._dev(h, "procs")["pids"]]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._dev(h, "draw")["draw"]

    def nvmlDeviceSetPowerManagementLimit(self, h: int, mw: int) -> None:
        d = self._dev(h, "set")
        if not d["min"] <= mw <= d["max"]:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        d["limit"] = mw


def devs() -> list[dict]:
    return [{"uuid": f"GPU-{i}", "min": 200_000, "max": 700_000, "default": 700_000, "limit": 700_000,
             "pids": [10 + i, 10 + i], "draw": 123_456} for i in range(2)]


@pytest.mark.parametrize("uuid_bytes", [False, True])
def test_read_normalises_uuid_and_reports_everything_in_milliwatts(uuid_bytes: bool) -> None:
    nvml = FakeNvml(devs(), uuid_bytes=uuid_bytes)
    b = NvmlBackend(nvml)
    r = b.read(1)
    assert (r.uuid, r.min_mw, r.max_mw, r.default_mw, r.current_mw, r.pids, r.draw_mw) == (
        "GPU-1", 200_000, 700_000, 700_000, 700_000, (11,), 123_456)
    assert b.device_count() == 2


def test_set_and_read_back() -> None:
    nvml = FakeNvml(devs())
    b = NvmlBackend(nvml)
    b.set_limit(0, 350_000)
    assert b.read_limit(0) == 350_000 and nvml.devices[1]["limit"] == 700_000


def test_an_nvml_error_is_a_gpu_error_for_that_gpu_only() -> None:
    nvml = FakeNvml(devs())
    nvml.broken[(0, "constraints")] = pynvml.NVML_ERROR_NOT_SUPPORTED
    b = NvmlBackend(nvml)
    with pytest.raises(GpuError, match="GPU 0: nvmlDeviceGetPowerManagementLimitConstraints: .*Not Supported") as err:
        b.read(0)
    assert (err.value.kind, err.value.uuid) == ("not_supported", "GPU-0")
    assert b.read(1).uuid == "GPU-1"
    with pytest.raises(GpuError, match="Invalid Argument"):
        b.set_limit(1, 50_000)


def test_missing_draw_is_not_an_error() -> None:
    nvml = FakeNvml(devs())
    nvml.broken[(0, "draw")] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert NvmlBackend(nvml).read(0).draw_mw is None


def test_init_failure_is_one_gpu_error() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(GpuError, match="NVML init failed: .*Driver Not Loaded"):
        NvmlBackend(Broken([]))


def test_close_logs_a_shutdown_error_with_its_traceback_and_does_not_raise(caplog) -> None:
    nvml = FakeNvml(devs())
    nvml.shutdown_error = pynvml.NVML_ERROR_UNINITIALIZED
    b = NvmlBackend(nvml)
    with caplog.at_level(logging.ERROR):
        b.close()
        b.close()  # once only
    assert nvml.calls.count("nvmlShutdown") == 1
    rec = [r for r in caplog.records if "NVML shutdown failed" in r.getMessage()]
    assert len(rec) == 1 and rec[0].exc_info is not None


def sim(*faults: str, index: int = 0) -> SimulatedGpus:
    g = SimulatedGpus([device(0, pids=[11]), device(1, pids=[12])])
    g.fail(index, *faults)
    return g


def test_a_library_mismatch_on_the_process_list_falls_back_to_the_older_call(caplog) -> None:
    g = sim("library_mismatch")
    with caplog.at_level(logging.WARNING):
        assert g.read(0).pids == (11,) and g.read(0).pids == (11,)
    # One warning per call family, not one per read; the other GPU was never affected.
    assert sum("NVMLLibraryMismatchError" in m for m in caplog.messages) == 2
    assert g.read(1).pids == (12,)


def test_uninitialized_after_a_driver_reload_re_initialises_nvml_once() -> None:
    g = sim()
    port = g._port()
    g.fail(0, "uninitialized")  # the driver was reloaded under the agent
    assert g.read(0).uuid == "GPU-0000"
    assert port.reinits == 1 and g.devices()[0].fail == []


@pytest.mark.parametrize("fault,call,kind", [
    ("gpu_lost", "read", "gpu_lost"),
    ("not_supported", "read", "not_supported"),
    ("no_permission", "set", "no_permission"),
    ("set", "set", "nvml"),
])
def test_each_driver_failure_is_a_gpu_error_of_that_gpu_with_its_kind(fault: str, call: str, kind: str) -> None:
    g = sim(fault)
    with pytest.raises(GpuError) as err:
        g.read(0) if call == "read" else g.set_limit(0, 300_000)
    assert err.value.kind == kind
    assert g.read(1).uuid == "GPU-0001"  # the other GPU goes on


def test_an_out_of_band_limit_is_reported_as_the_enforced_limit() -> None:
    g = SimulatedGpus([device(0, enforced_w=450)])
    g.set_limit(0, 600_000)
    assert g.read_limit(0) == 600_000 and g.read_enforced(0) == 450_000 and g.read(0).enforced_mw == 450_000


def test_any_exception_from_the_binding_is_a_gpu_error() -> None:
    class Odd(FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, h: int):
            raise RuntimeError("ctypes blew up")
    with pytest.raises(GpuError, match="ctypes blew up") as err:
        NvmlBackend(Odd(devs())).read(0)
    assert err.value.kind == "binding"


def test_uuid_normalisation() -> None:
    assert normalise_uuid(b"GPU-abc\x00") == "GPU-abc"
    with pytest.raises(GpuError):
        normalise_uuid(b"")
    with pytest.raises(GpuError):
        normalise_uuid(42)


def test_real_gpu_read_path_never_sets_anything() -> None:
    """Runs only where a GPU is present: count, UUIDs, constraints, limits, processes, draw."""
    try:
        backend = NvmlBackend()
    except GpuError as exc:
        pytest.skip(f"no GPU here: {exc}")
    try:
        count = backend.device_count()
        assert count > 0
        for i in range(count):
            r = backend.read(i)
            print(f"GPU {i}: {r}")
            assert r.uuid.startswith(("GPU-", "MIG-"))
            assert 0 < r.min_mw <= r.default_mw <= r.max_mw
            assert r.min_mw <= r.current_mw <= r.max_mw
            assert backend.read_limit(i) == r.current_mw
    finally:
        backend.close()
