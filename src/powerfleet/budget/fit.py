"""Integer fitting helpers shared by the GPU and power clamps (pure).

``fit`` lowers replica counts toward lower bounds so a weighted sum fits a capacity: a
proportional cut first (every role gives up the same fraction of its movable range), then a
largest-remainder refill that hands leftover capacity back one replica at a time, so no
clamped role is left a replica short of what the capacity allows ("no needless shrink").
"""

from __future__ import annotations

from collections.abc import Mapping


def weighted(counts: Mapping[str, int], cost: Mapping[str, int]) -> int:
    return sum(counts[r] * cost[r] for r in counts)


def fit(upper: Mapping[str, int], lower: Mapping[str, int], cost: Mapping[str, int], capacity: int) -> dict[str, int] | None:
    """Counts t with lower <= t <= upper and sum(t * cost) <= capacity, as close to ``upper``
    as the proportional rule and refill allow. None when even ``lower`` does not fit.

    Roles are visited in the mapping's order, which breaks ties deterministically.
    """
    if weighted(upper, cost) <= capacity:
        return dict(upper)
    base = weighted(lower, cost)
    if base > capacity:
        return None
    room = capacity - base
    span = sum((upper[r] - lower[r]) * cost[r] for r in upper)
    ideal = {r: float(upper[r]) if cost[r] == 0 else lower[r] + (upper[r] - lower[r]) * room / span for r in upper}
    out = {r: upper[r] if cost[r] == 0 else lower[r] + (upper[r] - lower[r]) * room // span for r in upper}
    _refill(out, upper, cost, capacity, ideal)
    return out


def _refill(t: dict[str, int], upper: Mapping[str, int], cost: Mapping[str, int], capacity: int,
            ideal: Mapping[str, float]) -> None:
    """Add replicas back (in place) while one fits, the role furthest behind its proportional
    share first (largest remainder), so cheap replicas fill what an expensive one cannot use."""
    used = weighted(t, cost)
    while True:
        best: str | None = None
        best_key: tuple[float, int] | None = None
        for i, r in enumerate(t):
            if t[r] >= upper[r] or used + cost[r] > capacity:
                continue
            key = (ideal[r] - t[r], -i)
            if best_key is None or key > best_key:
                best, best_key = r, key
        if best is None:
            return
        t[best] += 1
        used += cost[best]
