"""Safe caps: each GPU's deterministic share of its group's limit, used when the guard is gone.

A GPU's safe cap is its share of the limit in proportion to the cap it requested,
``limit x cap_i / sum of caps``, kept within [min_i, min(cap_i, max_i)]. Where the range
clips a share, the GPUs clipped are fixed at their bound and the rest of the limit is shared
again in proportion among the others, so the safe caps of a group whose minimum caps fit
its limit never add up to more than the limit. The computation needs only what every
agent is handed with each overlay, so the fallback needs no one to be reachable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuRange:
    """What the guard knows of one GPU besides its draw: requested cap and settable range (W)."""

    cap_w: float
    min_w: float
    max_w: float

    @property
    def top_w(self) -> float:
        """The highest cap the guard may leave in force: never above the request (nor below the
        card's minimum, which the agent would clamp a lower request to)."""
        return max(self.min_w, min(self.cap_w, self.max_w))


def refusal(group: str, gpus: Mapping[str, GpuRange], limit_w: float) -> str | None:
    """One line saying why ``group`` cannot be oversubscribed, or None when it can."""
    if not (math.isfinite(limit_w) and limit_w > 0):
        return f"group {group!r}: limit must be a positive number of W, got {limit_w}"
    if not gpus:
        return f"group {group!r}: no GPU to guard"
    floor = math.fsum(g.min_w for g in gpus.values())
    if floor > limit_w:
        return (f"group {group!r}: oversubscription refused: its {len(gpus)} GPUs' minimum caps sum to "
                f"{floor:g} W, above its limit of {limit_w:g} W")
    return None


def safe_caps(gpus: Mapping[str, GpuRange], limit_w: float) -> dict[str, float]:
    """Each GPU's safe cap (W), keyed as ``gpus``; deterministic in its inputs."""
    fixed: dict[str, float] = {}
    free = sorted(gpus)
    while free:
        budget = limit_w - math.fsum(fixed.values())
        weight = math.fsum(gpus[g].cap_w for g in free)
        share = {g: budget * gpus[g].cap_w / weight if weight > 0 else gpus[g].min_w for g in free}
        low = [g for g in free if share[g] < gpus[g].min_w]
        high = [g for g in free if share[g] > gpus[g].top_w]
        clip = low or high  # raise the lows first: that leaves less for the others
        if not clip:
            fixed.update(share)
            break
        for g in clip:
            fixed[g] = gpus[g].min_w if low else gpus[g].top_w
        free = [g for g in free if g not in fixed]
    return {g: fixed[g] for g in gpus}
