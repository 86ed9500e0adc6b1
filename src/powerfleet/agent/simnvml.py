"""A pynvml-shaped stand-in over simulated devices, raising nvidia-ml-py's own exceptions.

``NvmlBackend(SimulatedNvml(devices))`` runs the real NVML port over the simulated GPUs, so
the tests and the twin exercise the port's error handling rather than a second copy of it.
Every driver failure mode is switchable per GPU with the device's ``fail`` list (JSON, so
the twin's GPU file switches them too):

=================  =========================================================================
``fail`` entry     what the simulated driver does on that GPU
=================  =========================================================================
``read``           the UUID read fails (``NVML_ERROR_UNKNOWN``): the GPU cannot be read
``set``            the set fails (``NVML_ERROR_UNKNOWN``)
``readback``       the set "succeeds" but the limit does not change (a readback mismatch)
``no_permission``  the set fails with ``NVML_ERROR_NO_PERMISSION``
``not_supported``  every power-limit call fails with ``NVML_ERROR_NOT_SUPPORTED``
``library_mismatch``  the unversioned (``_v3``) process list raises ``NVMLLibraryMismatchError``;
                   the ``_v2`` call works (an older driver)
``uninitialized``  every call fails with ``NVML_ERROR_UNINITIALIZED`` until the next
                   ``nvmlInit`` (a driver reload), which clears the entry
``gpu_lost``       every call on the GPU fails with ``NVML_ERROR_GPU_IS_LOST``
``set_not_supported``  the limits read, but the set fails with ``NVML_ERROR_NOT_SUPPORTED``
``malformed``      the limit constraints come back as ``None`` (a binding returning a wrong
                   type: a ``TypeError`` in the port, not an NVML error)
=================  =========================================================================

``enforced_w`` on a device is an out-of-band limit (a BMC cap): the enforced limit the
driver reports is the lower of it and the management limit.

``mps_pids`` (default empty) are the MPS clients ``nvmlDeviceGetMPSComputeRunningProcesses``
lists; ``null``: the driver cannot list them (``NVML_ERROR_NOT_SUPPORTED``).

``persistence`` (default true) is the GPU's persistence mode (``nvmlDeviceGetPersistenceMode``).

``mig`` on a device lists the UUIDs (``MIG-…``) of its MIG devices, MIG mode on; empty: a GPU
without MIG, whose ``nvmlDeviceGetMigMode`` raises ``NVML_ERROR_NOT_SUPPORTED``. A MIG device
handle answers its UUID and its parent; its power-limit calls raise ``NOT_SUPPORTED`` (the
limit is the parent's), as on real MIG devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import pynvml
from pynvml import NVMLError, NVMLLibraryMismatchError

FAULTS = ("read", "set", "readback", "no_permission", "not_supported", "library_mismatch", "uninitialized",
          "gpu_lost", "set_not_supported", "malformed")


class _Device(Protocol):
    index: int
    uuid: str
    name: str | None
    min_w: float
    max_w: float
    default_w: float
    current_w: float | None
    pids: list[int]
    graphics_pids: list[int]
    mps_pids: list[int] | None
    draw_w: float | None
    enforced_w: float | None
    fail: list[str]
    mig: list[str]
    persistence: bool


class DeviceStore(Protocol):
    def devices(self) -> list[Any]: ...

    def set_current(self, index: int, milliwatts: int, *, applied: bool) -> None: ...

    def clear_fault(self, fault: str) -> None: ...


@dataclass(frozen=True)
class Handle:
    """A GPU handle names the device, as a real one does (a pointer into the driver's table): a
    re-enumeration moves the device it names, not the handle to another device."""

    index: int  # where the device was when the handle was taken
    uuid: str = ""


@dataclass(frozen=True)
class MigHandle:
    index: int  # the parent GPU's
    slot: int


MAX_MIG_DEVICES = 7  # A100/H100/H200: up to seven GPU instances


def _mw(w: float) -> int:
    return int(round(w * 1000))


class SimulatedNvml:
    """The calls ``NvmlBackend`` makes, answered from a ``DeviceStore`` (re-read on every call)."""

    def __init__(self, store: DeviceStore) -> None:
        self.store = store
        self.initialised = False

    # -- library --

    def nvmlInit(self) -> None:
        self.store.clear_fault("uninitialized")  # the driver came back: a fresh init works
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.store.devices())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        devices = self.store.devices()
        if not 0 <= index < len(devices):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check(devices[index], "handle")
        return Handle(index, devices[index].uuid)

    def _dev(self, h: Handle, op: str) -> _Device:
        devices = self.store.devices()
        if isinstance(h, MigHandle) and op in ("limit", "set", "draw"):
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a MIG device has no power limit of its own
        if isinstance(h, Handle) and h.uuid:
            dev = next((d for d in devices if d.uuid == h.uuid), None)
            if dev is None:  # the device it names is gone from the bus
                raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        elif not isinstance(h, (Handle, MigHandle)) or not 0 <= h.index < len(devices):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        else:
            dev = devices[h.index]
        self._check(dev, op)
        return dev

    @staticmethod
    def _check(dev: _Device, op: str) -> None:
        fail = set(dev.fail)
        if "gpu_lost" in fail:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if "uninitialized" in fail:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if op == "uuid" and "read" in fail:
            raise NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        if op == "limit" and "not_supported" in fail:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if op == "set":
            if "not_supported" in fail or "set_not_supported" in fail:
                raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if "no_permission" in fail:
                raise NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
            if "set" in fail:
                raise NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    # -- identity and limits --

    def nvmlDeviceGetUUID(self, h: Handle | MigHandle) -> str:
        dev = self._dev(h, "uuid")
        return dev.mig[h.slot] if isinstance(h, MigHandle) else dev.uuid

    # -- MIG --

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        if not self._dev(h, "mig").mig:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        return MAX_MIG_DEVICES if self._dev(h, "mig").mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, slot: int) -> MigHandle:
        dev = self._dev(h, "mig")
        if not dev.mig:
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= slot < len(dev.mig):
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # an empty slot
        return MigHandle(dev.index, slot)

    def nvmlDeviceIsMigDeviceHandle(self, h: Handle | MigHandle) -> bool:
        return isinstance(h, MigHandle)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: MigHandle) -> Handle:
        if not isinstance(h, MigHandle):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.nvmlDeviceGetHandleByIndex(h.index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle | MigHandle:
        for dev in self.store.devices():
            if dev.uuid == uuid:
                return Handle(dev.index, dev.uuid)
            if uuid in dev.mig:
                return MigHandle(dev.index, dev.mig.index(uuid))
        raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, h: Handle) -> str:
        return self._dev(h, "name").name or "NVIDIA H200"

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Handle) -> list[int] | None:
        d = self._dev(h, "limit")
        return None if "malformed" in d.fail else [_mw(d.min_w), _mw(d.max_w)]

    def nvmlDeviceGetPersistenceMode(self, h: Handle) -> int:
        on = self._dev(h, "persistence").persistence
        return pynvml.NVML_FEATURE_ENABLED if on else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetIndex(self, h: Handle) -> int:
        return self._dev(h, "index").index

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Handle) -> int:
        return _mw(self._dev(h, "limit").default_w)

    def nvmlDeviceGetPowerManagementLimit(self, h: Handle) -> int:
        d = self._dev(h, "limit")
        return _mw(d.current_w or d.default_w)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        d = self._dev(h, "limit")
        current = _mw(d.current_w or d.default_w)
        return current if d.enforced_w is None else min(current, _mw(d.enforced_w))

    def nvmlDeviceSetPowerManagementLimit(self, h: Handle, milliwatts: int) -> None:
        d = self._dev(h, "set")
        if not _mw(d.min_w) <= int(milliwatts) <= _mw(d.max_w):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.store.set_current(d.index, int(milliwatts), applied="readback" not in d.fail)

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        d = self._dev(h, "draw")
        if d.draw_w is None:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _mw(d.draw_w)

    # -- processes --

    @staticmethod
    def _procs(pids: list[int]) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in pids]

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[SimpleNamespace]:
        d = self._dev(h, "procs")
        if "library_mismatch" in d.fail:  # what nvidia-ml-py 13 raises where the driver lacks the _v3 symbol
            raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match "
                                           "the NVML lib version.")
        return self._procs(d.pids)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Handle) -> list[SimpleNamespace]:
        return self._procs(self._dev(h, "procs").pids)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Handle) -> list[SimpleNamespace]:
        d = self._dev(h, "procs")
        if "library_mismatch" in d.fail:
            raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match "
                                           "the NVML lib version.")
        return self._procs(d.graphics_pids)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h: Handle) -> list[SimpleNamespace]:
        return self._procs(self._dev(h, "procs").graphics_pids)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: Handle) -> list[SimpleNamespace]:
        d = self._dev(h, "procs")
        if d.mps_pids is None:  # a driver that cannot list MPS clients
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._procs(d.mps_pids)
