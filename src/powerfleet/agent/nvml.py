"""The GPU port on NVML through nvidia-ml-py (``import pynvml``).

The module object is injectable so the backend can be tested against a stand-in (there is
no GPU where powerfleet is developed). Only this file calls NVML; importing pynvml loads no
library (that happens in ``nvmlInit``), so this module imports anywhere.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import pynvml

from powerfleet.agent.gpu import GpuError, GpuReading, normalise_uuid

log = logging.getLogger(__name__)


class NvmlBackend:
    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else pynvml
        self._error: type[BaseException] = getattr(self._nvml, "NVMLError", Exception)
        try:
            self._nvml.nvmlInit()
        except self._error as exc:
            raise GpuError(f"NVML init failed: {exc}") from None
        except OSError as exc:  # libnvidia-ml.so missing: pynvml raises its own error or OSError
            raise GpuError(f"NVML init failed: {exc}") from None
        self._open = True

    def _call(self, what: str, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except self._error as exc:
            raise GpuError(f"{what}: {fn}: {exc}") from None

    def _handle(self, index: int) -> Any:
        return self._call(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)

    def device_count(self) -> int:
        return int(self._call("GPU count", "nvmlDeviceGetCount"))

    def read(self, index: int) -> GpuReading:
        h = self._handle(index)
        what = f"GPU {index}"
        uuid = normalise_uuid(self._call(what, "nvmlDeviceGetUUID", h))
        min_mw, max_mw = self._call(what, "nvmlDeviceGetPowerManagementLimitConstraints", h)
        default_mw = self._call(what, "nvmlDeviceGetPowerManagementDefaultLimit", h)
        current_mw = self._call(what, "nvmlDeviceGetPowerManagementLimit", h)
        procs = self._call(what, "nvmlDeviceGetComputeRunningProcesses", h)
        pids = tuple(sorted({int(p.pid) for p in procs or ()}))
        try:
            draw: int | None = int(self._nvml.nvmlDeviceGetPowerUsage(h))
        except self._error:
            draw = None  # draw is telemetry; a GPU without it is still managed
        return GpuReading(index=index, uuid=uuid, min_mw=int(min_mw), max_mw=int(max_mw),
                          default_mw=int(default_mw), current_mw=int(current_mw), pids=pids, draw_mw=draw)

    def set_limit(self, index: int, milliwatts: int) -> None:
        self._call(f"GPU {index}", "nvmlDeviceSetPowerManagementLimit", self._handle(index), int(milliwatts))

    def read_limit(self, index: int) -> int:
        return int(self._call(f"GPU {index}", "nvmlDeviceGetPowerManagementLimit", self._handle(index)))

    def close(self) -> None:
        """Shut NVML down. Errors are logged with their traceback, never swallowed silently."""
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except self._error:
            log.exception("NVML shutdown failed")
