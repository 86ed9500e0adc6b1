"""The drain and shutdown restore: giving GPUs back their default limit.

It works from the managed set (UUIDs this agent capped, from the state record) and a scan of
the node's GPUs, and never stops at one GPU's error. Startup recovery is a pass of its own
(``NodeLifecycle.start``): an idle managed GPU keeps its cap while its recorded owners or the
kubelet's allocations say a pod may still hold it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from powerfleet.agent.apply import apply_limit
from powerfleet.agent.gpu import GpuBackend, GpuError, GpuReading

log = logging.getLogger("powerfleet.agent")


@dataclass
class Scan:
    readings: list[GpuReading] = field(default_factory=list)
    complete: bool = True  # every GPU could be read (only then may absent UUIDs be dropped)

    def by_uuid(self) -> dict[str, GpuReading]:
        return {r.uuid: r for r in self.readings}


def scan(gpus: GpuBackend) -> Scan:
    out = Scan()
    try:
        count = gpus.device_count()
    except GpuError as exc:
        log.warning("GPU scan: cannot count GPUs: %s", exc)
        return Scan(complete=False)
    for i in range(count):
        try:
            out.readings.append(gpus.read(i))
        except GpuError as exc:
            log.warning("GPU scan: %s", exc)
            out.complete = False
    return out


def restore_default(gpus: GpuBackend, reading: GpuReading, why: str) -> bool:
    """Put the default limit back; True when it holds afterwards."""
    try:
        apply_limit(gpus, reading, reading.default_mw, why)
        return True
    except GpuError:
        log.exception("GPU %d (%s): restoring the default limit failed (%s)", reading.index, reading.uuid, why)
        return False


def restore_all(gpus: GpuBackend, managed: frozenset[str]) -> frozenset[str]:
    """Shutdown: every managed GPU back to its default. Returns what is still managed. Never raises."""
    if not managed:
        return managed
    try:
        seen = scan(gpus).by_uuid()
    except Exception:  # the shutdown path must not raise; the error is logged with its traceback
        log.exception("shutdown: GPU scan failed; caps stay as they are")
        return managed
    left = set(managed)
    for uuid in sorted(managed):
        reading = seen.get(uuid)
        if reading is None:
            log.error("shutdown: managed GPU %s not found; its cap stays", uuid)
            continue
        try:
            if restore_default(gpus, reading, "shutdown"):
                left.discard(uuid)
        except Exception:
            log.exception("shutdown: restoring GPU %s failed", uuid)
    return frozenset(left)
