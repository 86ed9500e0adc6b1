"""The live guard's metrics (``powerfleet_power_*``), exported by the control workers that run it.

The agent's side (overlays applied, fallback activations) is in the agent's own registry
(agent/throttle.py).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from powerfleet.power.live import GuardPeriod

MODES = ("release", "hold", "throttle_low", "throttle_all")

GUARD_MODE = Gauge("powerfleet_power_guard_mode", "1 for the mode the group's guard was in at its last period",
                   ["group", "mode"], multiprocess_mode="mostrecent")
MEASURED = Gauge("powerfleet_power_group_measured_watts",
                 "The group's measured draw as the guard counted it (silent GPUs at their safe caps)", ["group"],
                 multiprocess_mode="mostrecent")
LIMIT = Gauge("powerfleet_power_group_limit_watts", "The group's limit", ["group"], multiprocess_mode="mostrecent")
THROTTLED = Gauge("powerfleet_power_throttled_gpus", "GPUs the guard holds below their requested cap",
                  ["group"], multiprocess_mode="mostrecent")
STALE = Gauge("powerfleet_power_stale_gpus",
              "GPUs without a fresh, plausible report (lost), counted at max(safe cap, enforced limit)",
              ["group"], multiprocess_mode="mostrecent")
LOST = Gauge("powerfleet_power_lost_gpus", "Lost GPUs by why: unreadable, zero, stuck (power/sensors.py), silent",
             ["group", "fault"], multiprocess_mode="mostrecent")
FAULTS = ("unreadable", "zero", "stuck", "silent")
REFUSED = Gauge("powerfleet_power_group_refused",
                "1 while the group is refused oversubscription (its minimum caps exceed its limit)", ["group"],
                multiprocess_mode="mostrecent")
THROTTLE_EVENTS = Counter("powerfleet_power_throttle_events_total", "Caps the guard lowered, by priority",
                          ["group", "priority"])
EXCURSIONS = Counter("powerfleet_power_excursion_periods_total",
                     "Guard periods in which the group's measured draw was above its limit", ["group"])
GUARD_SLIPS = Counter("powerfleet_power_guard_slipped_periods_total",
                      "Periods the guard process skipped (missed) or started over half a period late (late); "
                      "power/loop.py", ["why"])
ADMISSION = Gauge("powerfleet_power_admission_state",
                  "1 for the group's admission at the last budget tick: admitted, or the reason it is closed",
                  ["group", "reason"], multiprocess_mode="mostrecent")
ADMISSION_CAPACITY = Gauge("powerfleet_power_admission_capacity_watts",
                           "Requested-cap watts the budget tick lets the group's deployments share", ["group"],
                           multiprocess_mode="mostrecent")
ADMISSION_REASONS = ("admitted", "telemetry_stale", "requested_over_ratio", "minimum_over_limit",
                     "measured_over_limit")


def record_admission(group: str, capacity_w: int, reason: str | None) -> None:
    ADMISSION_CAPACITY.labels(group=group).set(capacity_w)
    for r in ADMISSION_REASONS:
        ADMISSION.labels(group=group, reason=r).set(1 if (reason or "admitted") == r else 0)


def observe(group: str, limit_w: float, period: GuardPeriod) -> None:
    LIMIT.labels(group=group).set(limit_w)
    REFUSED.labels(group=group).set(1 if period.refused else 0)
    d = period.decision
    if d is None:
        return
    for mode in MODES:
        GUARD_MODE.labels(group=group, mode=mode).set(1 if d.mode == mode else 0)
    MEASURED.labels(group=group).set(d.measured_w)
    THROTTLED.labels(group=group).set(len(d.throttle))
    STALE.labels(group=group).set(len(d.stale))
    for fault in FAULTS:
        LOST.labels(group=group, fault=fault).set(sum(1 for f in period.faults.values() if f == fault))
    for e in d.events:
        THROTTLE_EVENTS.labels(group=group, priority=e.priority).inc()
    if period.over_limit:
        EXCURSIONS.labels(group=group).inc()
