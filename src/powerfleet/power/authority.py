"""Overlays carry no authority: the guard's record in Redis does (issue 29 item 2; docs/power.md).

Each period the guard writes its group's record, ``powerfleet:power:guard:<group>:overlays``, before
it sends anything: its epoch (fixed for as long as its memory lives), the period's revision, its
period and one overlay per node, expiring when the period's overlays would (1.5 periods). A
``powerfleet.agent.throttle`` message is only a wake-up: the agent reads the record when the task runs
and applies the record's overlay for its node, never the message's caps, and only when

* the group is one its own configuration oversubscribes (``unknown_group``),
* the message's period is within the configured guard period (``period``),
* the guard has a current record (``no_record``: none, expired, unreadable, or Redis unreachable:
  the overlay is then missed, and the agent's fallback takes over as for a guard that is down),
* the message is of the record's epoch (``foreign_epoch``) and revision (``future_revision``:
  above it; ``superseded``: below it, a late message whose successor is on its way),
* the record has an overlay for the message's node (``unknown_node``).

A refused message changes nothing and is counted (``powerfleet_agent_power_overlays_refused_total``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from powerfleet.power.overlay import Overlay

RECORD_KEY = "powerfleet:power:guard:{group}:overlays"
MAX_RECORD_BYTES = 4 * 1024 * 1024
REASONS = ("unknown_group", "period", "no_record", "foreign_epoch", "future_revision", "superseded", "unknown_node")


def record_json(overlays: Mapping[str, Overlay], epoch: str, revision: int, period_s: float, issued_at: float) -> str:
    """The guard's record of one period (what ``verify`` reads)."""
    return json.dumps({"epoch": epoch, "revision": revision, "period_s": period_s, "issued_at": issued_at,
                       "nodes": {n: o.model_dump(mode="json") for n, o in sorted(overlays.items())}},
                      allow_nan=False, sort_keys=True)


class Record(BaseModel):
    """The guard's record as it writes it, read strictly: no field is coerced (a null epoch is not
    the epoch "None"; a revision of 2.5, true or "3" is no revision; no NaN or Infinity), so a
    damaged or hand-written record authorises nothing."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, frozen=True)
    epoch: str
    revision: int
    period_s: float = Field(gt=0)
    issued_at: float
    nodes: dict[str, dict[str, Any]]


def parse_record(raw: str | bytes | None) -> Record | None:
    """The guard's record, or None for anything it would not have written."""
    if raw is None or len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        return Record.model_validate(json.loads(raw))
    except (ValidationError, ValueError, RecursionError):
        return None


def verify(message: Overlay, raw: str | bytes | None, groups: Collection[str],
           max_period_s: float) -> tuple[Overlay | None, str | None]:
    """(the overlay to apply, None) or (None, the reason it is refused)."""
    if message.group not in groups:
        return None, "unknown_group"
    if message.period_s > max_period_s * (1 + 1e-9):
        return None, "period"
    rec = parse_record(raw)
    if rec is None:
        return None, "no_record"
    if rec.epoch != message.epoch:
        return None, "foreign_epoch"
    if message.revision > rec.revision:
        return None, "future_revision"
    if message.revision < rec.revision:
        return None, "superseded"
    entry = rec.nodes.get(message.node)
    if entry is None:
        return None, "unknown_node"
    try:
        overlay = Overlay.model_validate(entry)
    except ValidationError:
        return None, "no_record"
    if (overlay.node, overlay.group, overlay.epoch, overlay.revision) != (message.node, message.group, rec.epoch,
                                                                          rec.revision):
        return None, "no_record"
    return overlay.model_copy(update={"period_s": min(overlay.period_s, max_period_s)}), None


def in_force(r: Any, groups: Collection[str]) -> list[dict[str, Any]]:
    """The overlays the guard has in force, per node, for ``status``: group, epoch, revision, the
    GPUs throttled (of those it names) and when the record expires (Redis's own TTL)."""
    groups = sorted(groups)
    pipe = r.pipeline(transaction=False)
    for g in groups:
        pipe.get(RECORD_KEY.format(group=g))
        pipe.pttl(RECORD_KEY.format(group=g))
    got = pipe.execute() if groups else []
    out = []
    for i, group in enumerate(groups):
        rec, ttl_ms = parse_record(got[2 * i]), got[2 * i + 1]
        if rec is None:
            continue
        for node, entry in sorted(rec.nodes.items()):
            caps, safe = dict(entry.get("caps") or {}), dict(entry.get("safe") or {})
            out.append({"node": node, "group": group, "source": f"guard epoch {rec.epoch}", "revision": rec.revision,
                        "throttled": len(caps), "gpus": len(safe), "caps": caps,
                        "expires_in_s": round(ttl_ms / 1000, 3) if isinstance(ttl_ms, int) and ttl_ms >= 0 else None})
    return out
