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

The ledger asks once per budget tick, for the whole group (``AdmissionRule.capacities``, called from
``budget.tick.tick_limits``): the answer is the watts of requested caps its deployments may share.
Open: ``r x L``, lowered where needed so the minimum caps fit L (``ceiling``). Closed: what the
group is charged now, never less than L and never more than the ceiling, so no deployment grows
past the cap-sum ledger's own budget while admission is closed, and nothing admitted earlier is
shrunk only because telemetry went quiet (its GPUs are at their safe caps meanwhile, which fit L).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DRAW_KEY = "powerfleet:power:draw:{group}"  # [t, W] per guard period, newest first: the window admission reads
MEMORY_KEY = "powerfleet:power:guard:{group}"  # the guard's memory (power/live.py's GuardMemory, JSON)


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


def ceiling(limit_w: float, ratio: float, floor_fraction: float) -> float:
    """The most requested-cap watts the group may hold: ``ratio x limit``, and no more than keeps its
    minimum caps within the limit when every GPU's minimum is at most ``floor_fraction`` of its cap."""
    return ratio * limit_w if floor_fraction <= 0 else min(ratio * limit_w, limit_w / floor_fraction)


@dataclass(frozen=True)
class GroupCapacity:
    watts: int  # what the ledger shares among the group's deployments this tick
    admission: Admission


def group_capacity(group: str, limit_w: int, ratio: float, charged_w: int, floor_fraction: float | None,
                   draw: Iterable[tuple[float, float]], now: float, *, window_s: float, reserve_w: float,
                   stale_s: float) -> GroupCapacity:
    """The watts an oversubscribed group's deployments may share (module docstring). ``charged_w``: the
    ledger's charge now (requested caps at current counts, every GPU pod included); ``floor_fraction``:
    the largest min/cap of the GPUs the guard knows (None: it knows none, which closes admission)."""
    if floor_fraction is None:
        a = Admission(False, "telemetry_stale", f"group {group!r}: the guard knows none of its GPUs; admission closed")
        top = ratio * limit_w
    else:
        top = ceiling(limit_w, ratio, floor_fraction)
        a = admit(group, limit_w, ratio, charged_w, charged_w * floor_fraction, draw, now, window_s=window_s,
                  reserve_w=reserve_w, stale_s=stale_s)
        if a.admitted:
            return GroupCapacity(int(top), a)
    return GroupCapacity(int(max(limit_w, min(charged_w, top))), a)


class GroupPower(Protocol):
    """What admission reads of a group: the guard's measured draw per period, and its GPUs' floor."""

    def draw(self, group: str) -> list[tuple[float, float]]: ...

    def floor_fraction(self, group: str) -> float | None: ...


def floor_of(memory: Any) -> float | None:
    """The largest min/cap among the GPUs in the guard's stored memory (None: none, or unreadable)."""
    try:
        fracs = [float(k["min_w"]) / float(k["cap_w"]) for k in memory["gpus"].values() if float(k["cap_w"]) > 0]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    fracs = [f for f in fracs if math.isfinite(f) and f >= 0]
    return max(fracs) if fracs else None


class RedisGroupPower:
    """The guard's figures in Redis (written by tasks/power.py): two reads per group."""

    def __init__(self, client: Any) -> None:
        self._r = client

    def draw(self, group: str) -> list[tuple[float, float]]:
        return parse_draw_history(self._r.lrange(DRAW_KEY.format(group=group), 0, -1))

    def floor_fraction(self, group: str) -> float | None:
        raw = self._r.get(MEMORY_KEY.format(group=group))
        try:
            return floor_of(json.loads(raw)) if raw else None
        except (ValueError, TypeError, RecursionError):
            return None


@dataclass(frozen=True)
class AdmissionRule:
    """Admission for every oversubscribed group, as the budget tick applies it."""

    ratios: Mapping[str, float]  # group -> ratio, only groups above 1.0
    source: GroupPower
    window_s: float
    reserve_fraction: float
    stale_s: float

    def capacities(self, budgets: Mapping[str, int], charged: Mapping[str, int], now: float
                   ) -> tuple[dict[str, int], dict[str, GroupCapacity]]:
        """(group -> watts to share, with each oversubscribed group's capacity in place of its limit;
        oversubscribed group -> its capacity and admission)."""
        shared, got = dict(budgets), {}
        for group, limit in sorted(budgets.items()):
            ratio = self.ratios.get(group, 1.0)
            if ratio <= 1.0:
                continue
            got[group] = group_capacity(group, limit, ratio, charged.get(group, 0), self.source.floor_fraction(group),
                                        self.source.draw(group), now, window_s=self.window_s,
                                        reserve_w=self.reserve_fraction * limit, stale_s=self.stale_s)
            shared[group] = got[group].watts
        return shared, got


def admission_rule(cfg: Any, client: Any) -> AdmissionRule | None:
    """The rule of a FleetConfig's oversubscribed groups (None: there are none)."""
    ratios = {g: cfg.budget.oversubscription_of(g) for g in cfg.budget.oversubscribed()}
    if not ratios:
        return None
    p = cfg.power
    return AdmissionRule(ratios, RedisGroupPower(client), p.admission_window_s, p.admission_reserve_fraction,
                         stale_s=2 * p.guard_period_s)
