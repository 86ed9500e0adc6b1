"""The checks the demo runs on itself, as pure functions of what it recorded.

Each returns a ``Check``: ``ok`` is True only when the property held over the whole record,
and ``detail`` says what was measured (or why it could not be: a capability that is absent
is a failed check with its reason, never a pass).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from powerfleet.twin.runtime import Sample


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    figures: Mapping[str, object] = field(default_factory=dict)  # what it measured, for summary.json


def power_within_budget(samples: Sequence[Sample], rack_budget_w: Mapping[str, float],
                        fleet_budget_w: float) -> Check:
    """Fleet and every rack at or below budget in every sample."""
    name = "power_within_budget"
    if not samples:
        return Check(name, False, "no power samples were taken")
    worst: tuple[float, str, float] | None = None  # (excess W, where, t)
    for s in samples:
        budgets = s.rack_budget_w or rack_budget_w  # the limits in force at the sample (a set_limit moves them)
        pairs = [(f"rack {r}", w, budgets.get(r, 0.0)) for r, w in s.rack_w.items()]
        pairs.append(("fleet", s.fleet_w, sum(s.rack_budget_w.values()) if s.rack_budget_w else fleet_budget_w))
        for where, w, budget in pairs:
            if w > budget and (worst is None or w - budget > worst[0]):
                worst = (w - budget, where, s.t)
    if worst is not None:
        return Check(name, False, f"{worst[1]} {worst[0]:.0f} W over budget at t={worst[2]:.0f}")
    peak = max(s.fleet_w for s in samples)
    return Check(name, True, f"{len(samples)} samples; fleet peak {peak:.0f} W of {fleet_budget_w:.0f} W")


def caps_match_annotations(samples: Sequence[Sample], allowed_lag_s: float, since: float | None = None) -> Check:
    """Every GPU's applied cap equals its pod's annotation, or gets there within ``allowed_lag_s``.

    A mismatch starts when a GPU's pod asks for a cap the GPU does not have (a new pod, a
    changed annotation) and ends when the applied cap matches; samples before ``since``
    (the fleet still starting) are not judged.
    """
    name = "caps_match_annotations"
    judged = [s for s in samples if since is None or s.t >= since]
    if not judged:
        return Check(name, False, "no samples after the fleet was up")
    open_since: dict[str, float] = {}
    worst: tuple[float, str] | None = None
    matched = 0
    for s in judged:
        for g in s.gpus:
            key = f"{g.node}/{g.index}"
            want = s.annotated_w.get(key)
            if want is None or abs(g.cap_w - want) < 0.5:
                if want is not None:
                    matched += 1
                open_since.pop(key, None)
                continue
            start = open_since.setdefault(key, s.t)
            lag = s.t - start
            if lag > allowed_lag_s and (worst is None or lag > worst[0]):
                worst = (lag, f"{key} at {g.cap_w:.0f} W while its pod {g.pod} asks {want:.0f} W")
    if worst is not None:
        return Check(name, False, f"{worst[1]} for {worst[0]:.0f} s (allowed {allowed_lag_s:.0f} s)")
    if matched == 0:
        return Check(name, False, "no GPU ever carried its pod's annotated cap")
    return Check(name, True, f"every annotated GPU matched within {allowed_lag_s:.0f} s ({matched} GPU samples matched)")


def windows_decided(launched: Iterable[tuple[str, int]], outcomes: Mapping[tuple[str, int], str],
                    still_running: Iterable[tuple[str, int]] = (), decided: Iterable[str] = (),
                    abandoned: Mapping[tuple[str, int], str] | None = None) -> Check:
    """Every launched retune window ended in a recorded outcome, and at least one in a decision.

    ``outcomes``: (deployment, window) -> the outcome its history records. A window the harvest
    abandoned with a recorded reason (the replicas changed under the sweep, a premise failed)
    ended in that decision; a launched window with no outcome at all was lost. Windows still
    inside their time budget at the end are not judged.
    """
    name = "retune_windows_decided"
    launched_set, running = set(launched), set(still_running)
    if not launched_set:
        return Check(name, False, "no retune window was launched")
    missing = sorted(launched_set - set(outcomes) - running)
    if missing:
        return Check(name, False, f"{len(missing)} launched windows without an outcome: "
                                  + ", ".join(f"{d}#{k}" for d, k in missing[:5]))
    ended = {w: o for w, o in outcomes.items() if w in launched_set}
    counts: dict[str, int] = {}
    for o in ended.values():
        counts[o] = counts.get(o, 0) + 1
    summary = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
    whys = [why for w, why in sorted((abandoned or {}).items()) if w in ended]
    if whys:  # each abandoned window with its reason, here as in the timeline
        summary += " (abandoned: " + "; ".join(whys[:5]) + (f"; {len(whys) - 5} more" if len(whys) > 5 else "") + ")"
    if not any(o in set(decided) for o in ended.values()):
        return Check(name, False, f"{len(launched_set)} windows launched, none decided ({summary or 'no outcome yet'})")
    return Check(name, True, f"{len(ended)} launched windows ended: {summary}"
                             + (f" ({len(running - set(outcomes))} still inside their time budget at the end)"
                                if running - set(outcomes) else ""))


# Celery logs a task that raised as "Task <name>[<id>] raised unexpected: <exc>"; a hard
# time limit as "Hard time limit (...) exceeded for <name>[<id>]".
_FAILURE = re.compile(r"raised unexpected|Hard time limit .* exceeded|WorkerLostError")


def no_task_failures(log_lines: Iterable[tuple[str, str]]) -> Check:
    """No task failed unexpectedly, from the fleet processes' logs: (process, line) pairs."""
    name = "no_unexpected_task_failures"
    failures = [(proc, line.strip()) for proc, line in log_lines if _FAILURE.search(line)]
    if failures:
        proc, line = failures[0]
        return Check(name, False, f"{len(failures)} failed tasks; first in {proc}: {line[:300]}")
    return Check(name, True, "no task raised, timed out or lost its worker")
