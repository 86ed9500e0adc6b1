"""The NVML backend against a stand-in pynvml module; the read path against a real GPU where one exists."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from powerfleet.agent.gpu import GpuError, normalise_uuid
from powerfleet.agent.nvml import NvmlBackend


class NVMLError(Exception):
    pass


class FakeNvml:
    """Just the pynvml calls the backend makes, over a list of dict devices (mW)."""

    NVMLError = NVMLError

    def __init__(self, devices: list[dict], *, uuid_bytes: bool = False) -> None:
        self.devices = devices
        self.uuid_bytes = uuid_bytes
        self.calls: list[str] = []
        self.broken: dict[tuple[int, str], str] = {}
        self.shutdown_error: str | None = None

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
            raise NVMLError("Invalid Argument")
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
            raise NVMLError("Invalid Argument")
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
    nvml.broken[(0, "constraints")] = "Not Supported"
    b = NvmlBackend(nvml)
    with pytest.raises(GpuError, match="GPU 0: nvmlDeviceGetPowerManagementLimitConstraints: Not Supported"):
        b.read(0)
    assert b.read(1).uuid == "GPU-1"
    with pytest.raises(GpuError, match="Invalid Argument"):
        b.set_limit(1, 50_000)


def test_missing_draw_is_not_an_error() -> None:
    nvml = FakeNvml(devs())
    nvml.broken[(0, "draw")] = "Not Supported"
    assert NvmlBackend(nvml).read(0).draw_mw is None


def test_init_failure_is_one_gpu_error() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise NVMLError("Driver Not Loaded")
    with pytest.raises(GpuError, match="NVML init failed: Driver Not Loaded"):
        NvmlBackend(Broken([]))


def test_close_logs_a_shutdown_error_with_its_traceback_and_does_not_raise(caplog) -> None:
    nvml = FakeNvml(devs())
    nvml.shutdown_error = "Uninitialized"
    b = NvmlBackend(nvml)
    with caplog.at_level(logging.ERROR):
        b.close()
        b.close()  # once only
    assert nvml.calls.count("nvmlShutdown") == 1
    rec = [r for r in caplog.records if "NVML shutdown failed" in r.getMessage()]
    assert len(rec) == 1 and rec[0].exc_info is not None


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
