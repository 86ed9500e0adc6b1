"""A simulated GPU backend, for tests, ``agent once`` and the digital twin.

Devices are plain JSON objects, the same shape ``agent once --gpus`` reads::

    {"index": 0, "uuid": "GPU-0a", "min_w": 200, "max_w": 700, "default_w": 700,
     "current_w": 700, "pids": [4242], "draw_w": 310.5,
     "fail": ["library_mismatch"],     # optional: driver failure modes of that GPU (simnvml.py)
     "enforced_w": 450,                # optional: an out-of-band (BMC) limit below the set one
     "mig": ["MIG-…", "MIG-…"]}        # optional: its MIG devices' UUIDs (MIG mode on)

``draw_w``, ``fail``, ``enforced_w``, ``graphics_pids``, ``mps_pids``, ``name`` and ``mig`` are optional;
``current_w`` defaults to ``default_w``. The ``GpuBackend`` methods go through the real NVML
port (``NvmlBackend``) over ``SimulatedNvml``, which raises nvidia-ml-py's own exceptions.

**Sharing across processes** (the twin drives the GPUs, the agent worker caps them): give
both the same file, one per node, e.g. ``<dir>/<node>.json`` holding ``{"devices": [...]}``.
``SimulatedGpus.shared(path)`` re-reads the file on every call, and every change is a
read-modify-write under an exclusive ``flock`` on ``<file>.lock``, written atomically
(temp file, fsync, rename), so a reader never sees half a file and neither side loses the
other's change. ``update(fn)`` is the twin's entry point (start/stop processes, move the
draw); the agent only sets limits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from powerfleet.agent.files import write_atomic
from powerfleet.agent.gpu import GpuError, GpuReading
from powerfleet.agent.simnvml import FAULTS, SimulatedNvml


class SimDevice(BaseModel):
    # strict: no true for a number; no inf/nan; watts up to 100 kW (a GPU board, not a data centre)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    index: int = Field(ge=0, le=1023)
    uuid: str = Field(min_length=1, max_length=96)
    min_w: float = Field(gt=0, le=100_000)
    max_w: float = Field(gt=0, le=100_000)
    default_w: float = Field(gt=0, le=100_000)
    current_w: float | None = Field(None, gt=0, le=100_000)
    pids: list[int] = Field(default_factory=list)
    graphics_pids: list[int] = Field(default_factory=list)
    mps_pids: list[int] | None = Field(default_factory=list)  # MPS clients; None: the driver cannot list them
    draw_w: float | None = Field(None, ge=0)
    enforced_w: float | None = Field(None, gt=0)
    name: str | None = Field(None, max_length=96)
    fail: list[str] = Field(default_factory=list)  # driver failure modes, simnvml.FAULTS
    mig: list[str] = Field(default_factory=list, max_length=7)  # MIG devices' UUIDs (MIG mode on)
    persistence: bool = True  # persistence mode (nvmlDeviceGetPersistenceMode)

    @model_validator(mode="after")
    def _limits(self) -> "SimDevice":
        if not self.min_w <= self.default_w <= self.max_w:
            raise ValueError("need min_w <= default_w <= max_w")
        for values in (self.pids, self.graphics_pids, self.mps_pids or []):
            if any(p <= 0 for p in values):
                raise ValueError("pids must be positive")
        if any(not m.startswith("MIG-") or len(m) > 96 for m in self.mig) or len(set(self.mig)) != len(self.mig):
            raise ValueError("mig: MIG device UUIDs start with 'MIG-', at most 96 characters, each once")
        unknown = sorted(set(self.fail) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fail mode(s) {unknown}; known: {', '.join(FAULTS)}")
        if self.current_w is None:
            self.current_w = self.default_w
        return self




def parse_devices(data: Any) -> list[SimDevice]:
    """A JSON list of devices (or ``{"devices": [...]}``) -> devices; ValueError naming the problem."""
    if isinstance(data, Mapping) and "devices" in data:
        data = data["devices"]
    if not isinstance(data, list):
        raise ValueError(f"expected a JSON list of GPUs, got {type(data).__name__}")
    out: list[SimDevice] = []
    for i, item in enumerate(data):
        try:
            out.append(SimDevice.model_validate(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(device)"
            raise ValueError(f"GPU [{i}]: {where}: {err['msg']}") from None
    indexes = [d.index for d in out]
    if sorted(indexes) != list(range(len(out))):
        raise ValueError(f"GPU indexes must be 0..{len(out) - 1} once each, got {sorted(indexes)}")
    if len({d.uuid for d in out}) != len(out):
        raise ValueError("GPU uuids must be unique")
    if len({m for d in out for m in d.mig}) != sum(len(d.mig) for d in out):
        raise ValueError("MIG device uuids must be unique across GPUs")
    return sorted(out, key=lambda d: d.index)


def _as_dicts(devices: Iterable[SimDevice | Mapping[str, Any]]) -> list[Any]:
    return [d.model_dump() if isinstance(d, SimDevice) else dict(d) for d in devices]


def write_devices(path: Path, devices: Iterable[SimDevice]) -> None:
    """Write ``{"devices": [...]}`` atomically (temp file in the same directory, fsync, rename)."""
    write_atomic(path, json.dumps({"devices": [d.model_dump() for d in devices]}, indent=1, sort_keys=True))


class SimulatedGpus:
    """``GpuBackend`` over simulated devices, in memory or shared through a JSON file."""

    def __init__(self, devices: Iterable[SimDevice | Mapping[str, Any]] = (), *, path: Path | None = None) -> None:
        """In memory from ``devices``; with ``path`` (see ``shared``) the file is the truth."""
        self._path = path
        self._mutex = threading.RLock()
        self._pin = threading.local()  # a snapshot pinned for the duration of one read (this thread)
        self._devices = [] if path is not None else parse_devices(_as_dicts(devices))
        self.sets: list[tuple[int, int]] = []  # (index, mW) of every set this object made, for tests
        self._nvml_port: Any = None

    @classmethod
    def shared(cls, path: str | os.PathLike[str], devices: Iterable[SimDevice | Mapping[str, Any]] | None = None) -> "SimulatedGpus":
        """Use the file at ``path``; create it from ``devices`` when given (overwriting)."""
        p = Path(path)
        if devices is not None:
            p.parent.mkdir(parents=True, exist_ok=True)
            with _flock(p):
                write_devices(p, parse_devices(_as_dicts(devices)))
        elif not p.exists():
            raise GpuError(f"simulated GPUs: {p} does not exist")
        return cls(path=p)

    @staticmethod
    def _read(path: Path) -> list[SimDevice]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise GpuError(f"simulated GPUs: cannot read {path}: {exc}") from None
        try:
            return parse_devices(data)
        except ValueError as exc:
            raise GpuError(f"simulated GPUs: {path}: {exc}") from None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            if self._path is None:
                yield
            else:
                with _flock(self._path):
                    yield

    @contextlib.contextmanager
    def _pinned(self) -> Iterator[None]:
        """One snapshot for the dozen driver calls of one GPU read (one file read, not twelve)."""
        if getattr(self._pin, "devices", None) is not None:
            yield
            return
        self._pin.devices = self.devices()
        try:
            yield
        finally:
            self._pin.devices = None

    def devices(self) -> list[SimDevice]:
        """A snapshot of the devices."""
        pinned = getattr(self._pin, "devices", None)
        if pinned is not None:
            return pinned
        with self._locked():
            if self._path is not None:
                self._devices = self._read(self._path)
            return [d.model_copy(deep=True) for d in self._devices]

    def update(self, fn: Callable[[list[SimDevice]], None]) -> None:
        """Read-modify-write the devices under the lock (the twin's entry point)."""
        with self._locked():
            if self._path is not None:
                self._devices = self._read(self._path)
            fn(self._devices)
            self._devices = parse_devices([d.model_dump() for d in self._devices])
            if self._path is not None:
                write_devices(self._path, self._devices)
            if getattr(self._pin, "devices", None) is not None:  # a read in progress sees the change
                self._pin.devices = [d.model_copy(deep=True) for d in self._devices]

    # -- the store SimulatedNvml reads and writes --

    def set_current(self, index: int, milliwatts: int, *, applied: bool) -> None:
        """A set through the simulated driver; ``applied=False``: accepted but without effect."""
        def change(devices: list[SimDevice]) -> None:
            if applied:
                devices[index].current_w = milliwatts / 1000

        self.update(change)
        self.sets.append((index, milliwatts))

    def clear_fault(self, fault: str) -> None:
        if not any(fault in d.fail for d in self.devices()):
            return  # no write when there is nothing to clear

        def change(devices: list[SimDevice]) -> None:
            for d in devices:
                d.fail = [f for f in d.fail if f != fault]

        self.update(change)

    def fail(self, index: int, *faults: str) -> None:
        """Switch driver failure modes on for one GPU (tests); ``fail(i)`` switches them off."""
        def change(devices: list[SimDevice]) -> None:
            devices[index].fail = list(faults)

        self.update(change)

    # -- GpuBackend, through the real NVML port --

    def _port(self) -> Any:
        if self._nvml_port is None:
            from powerfleet.agent.nvml import NvmlBackend  # nvml imports nothing of this module

            self._nvml_port = NvmlBackend(SimulatedNvml(self))
        return self._nvml_port

    def device_count(self) -> int:
        return int(self._port().device_count())

    def read(self, index: int) -> GpuReading:
        with self._pinned():
            return self._port().read(index)  # type: ignore[no-any-return]

    def set_limit(self, index: int, milliwatts: int, *, uuid: str | None = None) -> None:
        self._port().set_limit(index, milliwatts, uuid=uuid)

    def read_limit(self, index: int, *, uuid: str | None = None) -> int:
        return int(self._port().read_limit(index, uuid=uuid))

    def read_enforced(self, index: int, *, uuid: str | None = None) -> int | None:
        return self._port().read_enforced(index, uuid=uuid)  # type: ignore[no-any-return]

    def close(self) -> None:
        return None


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def write_proc_entry(proc_root: str | os.PathLike[str], pid: int, pod_uid: str | None, *,
                     qos: str = "burstable", container: str = "0123abcd", program: str | None = None) -> Path:
    """Write ``<proc_root>/<pid>/cgroup`` as a systemd-driver cgroup v2 container of ``pod_uid``
    (None: a host process, in a systemd service), and with ``program`` its ``cmdline``.

    For the twin and the tests: a simulated GPU process the agent maps to its pod.
    """
    if pod_uid is None:
        line = f"0::/system.slice/{os.path.basename(program or 'host')}.service\n"
    else:
        qos_part = "" if qos == "guaranteed" else f"-{qos}"
        slice_uid = pod_uid.replace("-", "_")
        line = (f"0::/kubepods.slice/kubepods{qos_part}.slice/kubepods{qos_part}-pod{slice_uid}.slice/"
                f"cri-containerd-{container}.scope\n")
    d = Path(proc_root) / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(line)
    if program is not None:
        (d / "cmdline").write_bytes(program.encode() + b"\0")
    return d / "cgroup"
