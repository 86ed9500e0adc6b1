"""The GPU backend port: what the agent needs from a node's GPUs, in NVML's own units (mW).

Two implementations: ``powerfleet.agent.nvml.NvmlBackend`` (real GPUs through nvidia-ml-py)
and ``powerfleet.agent.simulated.SimulatedGpus`` (tests, the digital twin, ``agent once``).
Every call that concerns one GPU raises ``GpuError`` for that GPU alone, so the caller can go
on with the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class GpuError(Exception):
    """A GPU call failed (for one GPU, or for the backend as a whole).

    ``kind`` names the failure so the agent can count and act on it: ``not_supported`` (no
    power-limit support: the GPU is reported and left out of readiness), ``uninitialized``
    (NVML lost its state, e.g. a driver reload: the backend re-initialises), ``no_permission``,
    ``gpu_lost``, ``library_mismatch`` (binding newer than the driver), ``invalid_argument``,
    ``nvml`` (any other NVML code), ``binding`` (any other exception from the binding),
    ``malformed`` (a value of the wrong type from the driver), ``moved`` (the GPU's UUID is no
    longer at the index it was read at: a re-enumeration), ``internal`` (a bug in the agent's
    own work on that GPU, confined to it), ``state`` (the write-ahead record could not be saved).
    """

    def __init__(self, message: str, *, kind: str = "nvml", uuid: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.uuid = uuid


@dataclass(frozen=True)
class GpuReading:
    """One GPU as read at the start of a pass. Limits and draw in milliwatts."""

    index: int
    uuid: str
    min_mw: int
    max_mw: int
    default_mw: int
    current_mw: int
    pids: tuple[int, ...] = field(default_factory=tuple)
    draw_mw: int | None = None
    # What the driver enforces after every limiter (nvmlDeviceGetEnforcedPowerLimit): below
    # current_mw when a BMC or another out-of-band limit caps the board. None: not readable.
    enforced_mw: int | None = None
    name: str | None = None  # the product name NVML reports (nvmlDeviceGetName), for the catalog
    # The MIG devices on this GPU (their MIG-… UUIDs) when MIG mode is on: the kubelet allocates
    # slices by these, and their power limit is this GPU's.
    mig_uuids: tuple[str, ...] = field(default_factory=tuple)
    # nvmlDeviceGetPersistenceMode: False when off (a limit "is not persistent across reboots or
    # driver unloads"; with no client holding NVML the driver may unload). None: not readable.
    persistence: bool | None = None
    # The MPS clients the driver lists (nvmlDeviceGetMPSComputeRunningProcesses; also in ``pids``).
    # None: the driver cannot list them, so an MPS server's clients are not known from NVML.
    mps_pids: tuple[int, ...] | None = None

    @property
    def idle(self) -> bool:
        return not self.pids


@runtime_checkable
class GpuBackend(Protocol):
    def device_count(self) -> int:
        """How many GPUs the node has now; GpuError if the backend cannot tell."""
        ...

    def read(self, index: int) -> GpuReading: ...

    # ``uuid``: the GPU the caller read at ``index``; a backend that can address by UUID does so
    # (a re-enumeration never redirects a set) and raises GpuError kind ``moved`` when the UUID
    # is no longer at ``index``.
    def set_limit(self, index: int, milliwatts: int, *, uuid: str | None = None) -> None: ...

    def read_limit(self, index: int, *, uuid: str | None = None) -> int:
        """The limit now in force as the driver reports it (for read-back after a set)."""
        ...

    def read_enforced(self, index: int, *, uuid: str | None = None) -> int | None:
        """The enforced limit after all limiters; None when the driver cannot tell."""
        ...

    def close(self) -> None: ...


def normalise_uuid(raw: object) -> str:
    """NVML bindings return the UUID as bytes or str depending on the version; always str."""
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("ascii", errors="replace")
    if not isinstance(raw, str):
        raise GpuError(f"GPU UUID has unexpected type {type(raw).__name__}")
    value = raw.strip().rstrip("\x00")
    if not value:
        raise GpuError("GPU UUID is empty")
    return value


def watts(milliwatts: int | None) -> int | float | None:
    """mW -> W for output: an int when exact, so JSON shows 350 rather than 350.0."""
    if milliwatts is None:
        return None
    return milliwatts // 1000 if milliwatts % 1000 == 0 else milliwatts / 1000
