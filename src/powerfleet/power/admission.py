"""Admission to an oversubscribed group (pure): may the ledger add a replica's GPUs to it?

With ``budget.groups.<g>.oversubscription`` = r above 1.0, a group of limit L admits replicas while
all of these hold (issue 22 item 4):

* ``requested_over_ratio``: the requested caps, the new replica's included, sum to at most r x L;
* ``minimum_over_limit``: the group's minimum caps, the new replica's included, sum to at most L
  (else even the guard at every GPU's minimum could not keep it under its limit: ``power.safe.refusal``);
* ``measured_over_limit``: the group's measured draw, its p99 over the recent window (the guard's
  per-period figures), plus a reserve, is at most L;
* ``telemetry_stale``: closes admission outright when the newest measured figure is older than
  ``stale_s`` (two guard periods) or the window holds none: growth cannot be shown safe blind.

The first that fails is the reason. A group at r = 1.0 is not oversubscribed; its admission is the
cap-sum ledger's (docs/budget.md), not this.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str | None  # None when admitted
    message: str
    p99_w: float | None = None


def p99(values: Sequence[float]) -> float:
    """Nearest-rank 99th percentile (the value at or above which 1 % of the samples lie)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def admit(group: str, limit_w: float, ratio: float, requested_w: float, minimum_w: float,
          draw: Iterable[tuple[float, float]], now: float, *, window_s: float, reserve_w: float,
          stale_s: float) -> Admission:
    """``requested_w`` / ``minimum_w``: the group's sums with the candidate's GPUs; ``draw``: (time, W)
    of the group's measured draw, one per guard period, any order."""
    recent = [(t, w) for t, w in draw if now - window_s <= t <= now and math.isfinite(w)]
    newest = max((t for t, _ in recent), default=None)
    if newest is None or now - newest > stale_s:
        age = "none in the window" if newest is None else f"newest {now - newest:.1f}s old"
        return Admission(False, "telemetry_stale", f"group {group!r}: measured draw is stale ({age}, limit "
                         f"{stale_s:g}s); admission closed")
    if requested_w > ratio * limit_w:
        return Admission(False, "requested_over_ratio", f"group {group!r}: requested caps {requested_w:g} W exceed "
                         f"{ratio:g} x its limit ({ratio * limit_w:g} W)")
    if minimum_w > limit_w:
        return Admission(False, "minimum_over_limit", f"group {group!r}: minimum caps {minimum_w:g} W exceed its "
                         f"limit of {limit_w:g} W")
    high = p99([w for _, w in recent])
    if high + reserve_w > limit_w:
        return Admission(False, "measured_over_limit", f"group {group!r}: measured p99 {high:g} W + reserve "
                         f"{reserve_w:g} W exceed its limit of {limit_w:g} W", high)
    return Admission(True, None, f"group {group!r}: admitted (requested {requested_w:g} W of {ratio * limit_w:g} W, "
                     f"p99 {high:g} W + reserve {reserve_w:g} W within {limit_w:g} W)", high)


def parse_draw_history(raw: Iterable[str | bytes]) -> list[tuple[float, float]]:
    """The guard's per-period figures as stored (``[t, W]`` JSON each); anything malformed is skipped."""
    out = []
    for item in raw:
        try:
            t, w = json.loads(item)
            t, w = float(t), float(w)
        except (ValueError, TypeError, RecursionError):
            continue
        if math.isfinite(t) and math.isfinite(w) and w >= 0:
            out.append((t, w))
    return out
