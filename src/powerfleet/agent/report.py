"""What one pass did, per GPU and as a whole: the agent's output and its enforcement evidence.

``GpuOutcome`` keeps Dynamo's five quantities apart (../shared/research/power_control.md
1.2): the requested cap, the post-clamp target, the enforced limit read back from the same
GPU UUID (only after a write and readback that succeeded), the measured draw, and the
cap-intent revision.
"""

from __future__ import annotations

from pydantic import BaseModel


class GpuOutcome(BaseModel):
    """What a pass did (or, dry, would do) on one GPU. Watts; None where not applicable."""

    index: int
    uuid: str | None
    pods: list[str]
    decision: str | None  # None when the GPU could not be read
    requested_w: int | float | None
    cap_w: int | float | None  # the post-clamp target; None when nothing is applied
    current_w: int | float | None
    draw_w: int | float | None = None
    action: str  # set | hold | none | error | unsupported (dry run: would-set | hold | none)
    clamped: str | None = None  # min | max
    reason: str = ""
    error: str | None = None
    error_kind: str | None = None  # GpuError.kind when error is set
    min_w: int | float | None = None  # the range the cap was validated against (device and catalog)
    max_w: int | float | None = None
    enforced_w: int | float | None = None  # read back after the write; None when write or readback failed
    write: str = "skipped"  # ok | failed | skipped (no write needed or allowed)
    readback: str = "skipped"  # match | mismatch | failed | skipped
    revision: int | None = None  # cap-intent revision of the target in force
    unattributed: int = 0  # processes mapped to no pod the agent can see
    persistence: bool | None = None  # the GPU's persistence mode (None: not readable)
    excluded: bool = False  # failing for several passes: left out of readiness, retried (agent/failing.py)
    overlay: str | None = None  # the power guard's part in cap_w: throttle | fallback | annotation; None: no overlay


class PassReport(BaseModel):
    node: str
    trigger: str
    dry_run: bool
    at: float
    duration_s: float
    skipped: str | None = None  # why the pass changed nothing, when it did not run
    gpus: list[GpuOutcome] = []
    managed: list[str] = []
    blind: str | None = None  # why the agent cannot attribute processes (proc root), when it cannot

    @property
    def good(self) -> bool:
        """Every GPU that can be capped is enforced: no skip, no blind spot, no error other than
        a GPU without power-limit support or one excluded after failing passes (both reported,
        and left out of readiness)."""
        return (self.skipped is None and self.blind is None
                and not any(g.error and g.action != "unsupported" and not g.excluded for g in self.gpus))

    @property
    def persistence_off(self) -> list[str]:
        """UUIDs of the GPUs whose persistence mode is off, for the readiness detail."""
        return [g.uuid for g in self.gpus if g.uuid and g.persistence is False]

    @property
    def excluded(self) -> list[str]:
        """``<uuid or index>(<kind>)`` of the GPUs left out of readiness, for the readiness detail."""
        return [f"{g.uuid or f'index {g.index}'}({g.error_kind})" for g in self.gpus if g.excluded]
