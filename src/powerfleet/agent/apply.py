"""Putting one decision on one GPU: set, read back (clamping into the card's range is the pass's)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from powerfleet.agent.gpu import GpuBackend, GpuError, GpuReading, watts

log = logging.getLogger("powerfleet.agent")


@dataclass(frozen=True)
class Applied:
    cap_mw: int
    action: Literal["set", "hold"]  # hold: the limit already was the cap, nothing written


class ApplyFailed(GpuError):
    """A set or its read-back failed; ``stage`` says which (``write`` or ``readback``)."""

    def __init__(self, message: str, *, stage: str, kind: str) -> None:
        super().__init__(message, kind=kind)
        self.stage = stage


def apply_limit(gpus: GpuBackend, reading: GpuReading, cap_mw: int, decision: str) -> Applied:
    """Set ``cap_mw`` (already clamped) unless it already holds, then read it back.

    Raises ApplyFailed when the set fails or the read-back fails or differs, so the caller
    counts an apply failure, publishes no enforced value and does not record the GPU as managed.
    """
    if reading.current_mw == cap_mw:
        return Applied(cap_mw, "hold")
    try:
        gpus.set_limit(reading.index, cap_mw, uuid=reading.uuid)
    except GpuError as exc:
        raise ApplyFailed(str(exc), stage="write", kind=exc.kind) from None
    try:
        now = gpus.read_limit(reading.index, uuid=reading.uuid)
    except GpuError as exc:
        raise ApplyFailed(str(exc), stage="readback", kind=exc.kind) from None
    if now != cap_mw:
        raise ApplyFailed(f"GPU {reading.index}: read back {watts(now)} W after setting {watts(cap_mw)} W",
                          stage="readback", kind="mismatch")
    log.info("GPU %d (%s): %s W -> %s W (%s)", reading.index, reading.uuid, watts(reading.current_mw),
             watts(cap_mw), decision)
    return Applied(cap_mw, "set")
