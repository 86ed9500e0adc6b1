"""The GPU port on NVML through nvidia-ml-py (``import pynvml``).

The module object is injectable: the simulated backend (``simnvml.SimulatedNvml``) is a
pynvml-shaped object raising pynvml's own exception classes, so the tests and the twin run
this very code. Only this file calls NVML; importing pynvml loads no library (that happens
in ``nvmlInit``), so this module imports anywhere.

What real drivers do and this port absorbs (docs/agent.md, "Driver failure modes"):

* any exception from the binding is a ``GpuError`` of that GPU, never the pass's, including
  ``NVMLLibraryMismatchError`` (a plain ``Exception``: nvidia-ml-py 13 calls the ``_v3``
  process list, missing from older drivers), for which the ``_v2`` call is used instead;
* ``NVML_ERROR_UNINITIALIZED`` (a driver reload) re-initialises NVML once and retries;
* ``NVML_ERROR_NOT_SUPPORTED`` on the power-limit calls is kind ``not_supported``;
* MIG: the power limit is the parent GPU's (a MIG device handle has none), so the port reads
  the limits on the parent and lists its MIG devices' UUIDs (``nvmlDeviceGetMigMode``,
  ``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``, an empty slot
  being ``NVML_ERROR_NOT_FOUND``), which is how the agent maps a pod's MIG allocation to the
  GPU it caps. A GPU without MIG (``NOT_SUPPORTED``) or with MIG off has none. The parent's
  process lists include the processes of its MIG devices.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import pynvml

from powerfleet.agent.gpu import GpuError, GpuReading, normalise_uuid

log = logging.getLogger(__name__)

T = TypeVar("T")

_KINDS = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: "not_supported",
    pynvml.NVML_ERROR_UNINITIALIZED: "uninitialized",
    pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
    pynvml.NVML_ERROR_GPU_IS_LOST: "gpu_lost",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "library_mismatch",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "invalid_argument",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "driver_not_loaded",
}


def error_kind(exc: BaseException) -> str:
    """The ``GpuError.kind`` for an exception raised by the binding."""
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return "library_mismatch"
    if isinstance(exc, pynvml.NVMLError):
        return _KINDS.get(getattr(exc, "value", None), "nvml")
    return "binding"


def describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


# Process lists, newest call first; an older driver lacks the newest symbol.
_PROCESS_CALLS = {
    "compute": ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    "mps": ("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2"),
}


class NvmlBackend:
    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else pynvml
        self._mutex = threading.Lock()
        self._fallbacks: set[str] = set()  # process-list families served by the older call
        self._open = False
        # UUID -> the handle this session's reads took for it: sets and readbacks use it (checked
        # against the index the pass read the GPU at), and it goes on re-init and on any error
        # through it (GPU_IS_LOST, NOT_FOUND, ...), when the next call resolves the UUID again.
        self._handles: dict[str, Any] = {}
        self.reinits = 0  # re-initialisations after Uninitialized, for tests and the probe
        self._init()

    def _init(self) -> None:
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # pynvml raises NVMLError, OSError or its own errors when the library is absent
            raise GpuError(f"NVML init failed: {describe(exc)}", kind=error_kind(exc)) from None
        self._handles = {}  # handles do not outlive the session (a re-init may re-enumerate)
        self._open = True

    def _again(self, op: Callable[[], T]) -> T:
        """Run ``op``; after ``Uninitialized`` (driver reload) re-initialise NVML once and retry."""
        try:
            return op()
        except GpuError as exc:
            if exc.kind != "uninitialized":
                raise
        with self._mutex:
            log.warning("NVML reports Uninitialized (driver reloaded?); re-initialising")
            self._init()
            self.reinits += 1
        return op()

    def _call(self, what: str, fn: str, *args: Any, uuid: str | None = None) -> Any:
        try:
            return getattr(self._nvml, fn)(*args)
        except Exception as exc:  # anything from the binding is this GPU's error, never the pass's
            raise GpuError(f"{what}: {fn}: {describe(exc)}", kind=error_kind(exc), uuid=uuid) from None

    def _optional(self, fn: str, *args: Any) -> Any:
        """Telemetry calls: None when the GPU cannot answer (never an error of the GPU)."""
        try:
            return getattr(self._nvml, fn)(*args)
        except Exception:
            return None

    def _handle(self, index: int) -> Any:
        return self._call(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)

    def device_count(self) -> int:
        return self._again(lambda: int(self._call("GPU count", "nvmlDeviceGetCount")))

    def _processes(self, h: Any, what: str, family: str, uuid: str) -> set[int] | None:
        """The family's PIDs; None for a graphics or MPS list the driver cannot give."""
        newest, older = _PROCESS_CALLS[family]
        calls = [older] if family in self._fallbacks else [newest, older]
        for fn in calls:
            if not hasattr(self._nvml, fn):
                continue
            try:
                return {int(p.pid) for p in getattr(self._nvml, fn)(h) or ()}
            except Exception as exc:
                kind = error_kind(exc)
                if kind == "library_mismatch" and fn == newest:
                    log.warning("%s: %s: %s; using %s from now on", what, fn, describe(exc), older)
                    self._fallbacks.add(family)
                    continue
                if family != "compute" and kind in ("not_supported", "library_mismatch"):
                    return None  # graphics/MPS lists are extra coverage; compute is the one that must work
                raise GpuError(f"{what}: {fn}: {describe(exc)}", kind=kind, uuid=uuid) from None
        if family == "compute":
            raise GpuError(f"{what}: no usable process-list call in the binding", kind="library_mismatch", uuid=uuid)
        return None

    def _read(self, index: int) -> GpuReading:
        h = self._handle(index)
        what = f"GPU {index}"
        uuid = normalise_uuid(self._call(what, "nvmlDeviceGetUUID", h))
        self._handles[uuid] = h
        try:
            return self._read_values(index, h, what, uuid)
        except (TypeError, ValueError, AttributeError) as exc:  # a malformed value, not an NVML error
            raise GpuError(f"{what}: malformed value from the driver: {describe(exc)}", kind="malformed",
                           uuid=uuid) from None

    def _read_values(self, index: int, h: Any, what: str, uuid: str) -> GpuReading:
        min_mw, max_mw = self._call(what, "nvmlDeviceGetPowerManagementLimitConstraints", h, uuid=uuid)
        default_mw = self._call(what, "nvmlDeviceGetPowerManagementDefaultLimit", h, uuid=uuid)
        current_mw = self._call(what, "nvmlDeviceGetPowerManagementLimit", h, uuid=uuid)
        lists = {family: self._processes(h, what, family, uuid) for family in _PROCESS_CALLS}
        pids = set().union(*(got for got in lists.values() if got is not None))
        mps = lists["mps"]
        draw = self._optional("nvmlDeviceGetPowerUsage", h)  # telemetry: a GPU without it is still managed
        enforced = self._optional("nvmlDeviceGetEnforcedPowerLimit", h)
        name = self._optional("nvmlDeviceGetName", h)
        mig = self._mig_devices(h)
        persistence = self._optional("nvmlDeviceGetPersistenceMode", h)
        return GpuReading(index=index, uuid=uuid, min_mw=int(min_mw), max_mw=int(max_mw),
                          default_mw=int(default_mw), current_mw=int(current_mw), pids=tuple(sorted(pids)),
                          draw_mw=None if draw is None else int(draw),
                          enforced_mw=None if enforced is None else int(enforced),
                          name=None if name is None else _text(name), mig_uuids=mig,
                          persistence=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
                          mps_pids=None if mps is None else tuple(sorted(mps)))

    def _mig_devices(self, h: Any) -> tuple[str, ...]:
        """The UUIDs of the MIG devices on this GPU; () when it has no MIG or MIG is off. Telemetry
        grade: a failing MIG call loses the mapping of slices, never the GPU."""
        mode = self._optional("nvmlDeviceGetMigMode", h)
        if not mode or int(mode[0]) != pynvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        out: list[str] = []
        for slot in range(int(self._optional("nvmlDeviceGetMaxMigDeviceCount", h) or 0)):
            mig = self._optional("nvmlDeviceGetMigDeviceHandleByIndex", h, slot)  # NOT_FOUND: an empty slot
            raw = None if mig is None else self._optional("nvmlDeviceGetUUID", mig)
            if raw is not None:
                out.append(normalise_uuid(raw))
        return tuple(out)

    def read(self, index: int) -> GpuReading:
        return self._again(lambda: self._read(index))

    def _handle_of(self, index: int, uuid: str | None) -> Any:
        """The handle a set or readback addresses: by UUID when given (the one this session's read
        took, else resolved by UUID), checked against the index the pass read it at."""
        if uuid is None:
            return self._handle(index)
        h = self._handles.get(uuid)
        if h is None:
            h = self._handles[uuid] = self._call(f"GPU {index}", "nvmlDeviceGetHandleByUUID", uuid, uuid=uuid)
        now = self._optional("nvmlDeviceGetIndex", h)
        if now is not None and int(now) != index:
            raise GpuError(f"GPU {uuid} moved from index {index} to {now} (re-enumerated); its work stops this pass",
                           kind="moved", uuid=uuid)
        return h

    def _by_uuid(self, index: int, uuid: str | None, op: Callable[[Any], T]) -> T:
        """``op(handle)`` for the GPU; after an error through a cached handle it is dropped."""
        def once() -> T:
            try:
                return op(self._handle_of(index, uuid))
            except GpuError:
                if uuid is not None:
                    self._handles.pop(uuid, None)
                raise
        return self._again(once)

    def set_limit(self, index: int, milliwatts: int, *, uuid: str | None = None) -> None:
        self._by_uuid(index, uuid, lambda h: self._call(f"GPU {index}", "nvmlDeviceSetPowerManagementLimit", h,
                                                        int(milliwatts), uuid=uuid))

    def read_limit(self, index: int, *, uuid: str | None = None) -> int:
        def op(h: Any) -> int:
            got = self._call(f"GPU {index}", "nvmlDeviceGetPowerManagementLimit", h, uuid=uuid)
            if type(got) is not int:
                raise GpuError(f"GPU {index}: malformed limit {got!r} from the driver", kind="malformed", uuid=uuid)
            return got
        return self._by_uuid(index, uuid, op)

    def read_enforced(self, index: int, *, uuid: str | None = None) -> int | None:
        def op(h: Any) -> int | None:
            got = self._optional("nvmlDeviceGetEnforcedPowerLimit", h)
            return got if type(got) is int else None
        return self._by_uuid(index, uuid, op)

    def close(self) -> None:
        """Shut NVML down. Errors are logged with their traceback, never swallowed silently."""
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            log.exception("NVML shutdown failed")


def _text(raw: object) -> str:
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).decode("ascii", errors="replace").strip("\x00 ")
    return str(raw)
