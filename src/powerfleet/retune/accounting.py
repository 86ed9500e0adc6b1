"""Every window ends in exactly one recorded outcome: launch bookkeeping and the leader's audit.

A window is *launched* by a fenced state write (``pending`` + ``last_launched``; "enabled at"
lives there too), before its message is sent, so neither a Redis restart without persistence
nor a lost message can make it vanish. It then ends in exactly one outcome, saved (fenced)
with the history:

* decided: ``apply``, ``keep`` or ``advisory``;
* abandoned with a reason: ``no-traffic``, or ``abandoned`` (time budget, premises, cut);
* ``dropped`` with a reason: ``leader-change``, ``configuration-change``, ``send-failed``,
  ``lost-broker-state``;
* ``skipped``: closed and never launched (only the newest closed window is launched): one
  history record per gap, reason ``tick-outage`` or ``leader-handover``, each window counted.

``record`` refuses a second outcome for a window. ``audit`` (each leader round) ends the
windows that nothing else will end: a window launched under an older term or configuration
that never got a sweep, or one whose launch message or sweep record vanished by its deadline.
A window whose sweep exists is left to the harvest, which the new leader runs too.
"""

from __future__ import annotations

from typing import Any

from powerfleet.retune.context import Deployment, Ports
from powerfleet.retune.leadership import Term
from powerfleet.retune.metrics import DECISIONS
from powerfleet.retune.state import DecisionRecord, RetuneState
from powerfleet.retune.windows import dedupe_key, first_launchable_index, windows_to_launch

WINDOW_TASK = "powerfleet.retune.window"
# Redis hashes of the schedule before it moved into the state: read once to carry it over.
LEGACY_ENABLED_AT = "powerfleet:retune:enabled_at"


def outcome(dep: Deployment, term: Term, k: int, what: str, reason: str, failure: str | None,
            now: float, **extra: Any) -> DecisionRecord:
    return DecisionRecord(window=k, outcome=what, mode=dep.settings.mode, reason=reason,  # type: ignore[arg-type]
                          failure_reason=failure, term=term.term, generation=dep.settings.generation, at=now, **extra)


def record(dep: Deployment, term: Term, rec: DecisionRecord, change: Any = None) -> RetuneState | None:
    """Save one window's outcome (fenced); None when the window has its outcome already."""
    saved: dict[str, bool] = {}

    def apply(s: RetuneState) -> RetuneState:
        if rec.window >= 0 and (s.decided(rec.window) or any(h.window == rec.window for h in s.history)):
            return s
        saved["yes"] = True
        s = s.with_decision(rec, dep.settings.history)
        s = s.model_copy(update={"last_window": max(rec.window, s.last_window if s.last_window is not None
                                                    else rec.window)})
        return change(s) if change else s

    state = dep.store.update(term, apply)
    if saved:
        DECISIONS.labels(dep.name, rec.outcome, rec.failure_reason or "").inc()
    return state if saved else None


def drop(dep: Deployment, term: Term, k: int, code: str, reason: str, now: float) -> RetuneState | None:
    saved = record(dep, term, outcome(dep, term, k, "dropped", reason, code, now))
    if saved is not None:
        dep.event("RetuneWindowDropped", f"window {k} dropped ({code}): {reason}", warning=True)
    return saved


def launch_due(ports: Ports, dep: Deployment, t: Term, state: RetuneState, now: float) -> tuple[RetuneState, list[int]]:
    """Launch the newest closed window not launched yet: saved as pending first, then sent."""
    s = dep.settings
    if state.enabled_at is None:
        legacy = ports.r.hget(LEGACY_ENABLED_AT, dep.name)
        at = float(legacy) if legacy is not None else now
        state = dep.store.update(t, lambda x: x if x.enabled_at is not None else x.model_copy(update={"enabled_at": at}))
    assert state.enabled_at is not None
    launched = []
    for w in windows_to_launch(now, state.enabled_at, state.last_launched, s.interval_s, s.phase_s):
        state = _skip_gap(dep, t, state, w.index, now)
        state = dep.store.update(t, lambda x, k=w.index: x.launched(k, now, t.term, s.generation))
        # Several processes of one leader may tick at once: one of them sends.
        if not ports.r.set(dedupe_key(dep.name, w.index), repr(now), nx=True, ex=7 * 86400):
            continue
        try:
            ports.send(WINDOW_TASK, {"dgd": dep.name, "window": w.index, "leader": t.identity, "term": t.term,
                                     "generation": s.generation}, {})
        except Exception as exc:  # the broker refused it: the window ends here, said so
            state = drop(dep, t, w.index, "send-failed", f"the window message could not be sent: "
                         f"{type(exc).__name__}: {exc}", now) or state
            continue
        launched.append(w.index)
    return state, launched


def _skip_gap(dep: Deployment, t: Term, state: RetuneState, k: int, now: float) -> RetuneState:
    """Record the closed windows before ``k`` that were never launched (``skipped``)."""
    s = dep.settings
    assert state.enabled_at is not None
    first = first_launchable_index(state.enabled_at, s.interval_s, s.phase_s)
    if state.last_launched is not None:
        first = max(first, state.last_launched + 1)
    if state.last_window is not None:
        first = max(first, state.last_window + 1)
    if first > k - 1:
        return state
    launches = [p.term for p in state.pending if p.window == state.last_launched]
    before = next(iter(launches), next((h.term for h in reversed(state.history) if h.window == state.last_launched),
                                      t.term))
    code = "leader-handover" if before != t.term else "tick-outage"
    why = (f"windows {first} to {k - 1} ({k - first}) closed without being launched "
           f"({'a leader handover' if code == 'leader-handover' else 'no leader round ran'} in between; "
           f"only the newest closed window, {k}, is launched)")
    rec = outcome(dep, t, k - 1, "skipped", why, code, now)

    wrote: list[bool] = []

    def change(x: RetuneState) -> RetuneState:
        wrote.clear()
        if x.last_window is not None and x.last_window >= k - 1:
            return x  # recorded by another round of this leader
        wrote.append(True)
        return x.with_skipped(rec, first, s.history)

    saved = dep.store.update(t, change)
    if wrote:
        DECISIONS.labels(dep.name, "skipped", code).inc(k - first)
    return saved


def audit(ports: Ports, dep: Deployment, t: Term, state: RetuneState, now: float) -> list[dict[str, Any]]:
    """End the pending windows nothing else will end; returns what was dropped."""
    running = {rec.window for rec in ports.fanin.active(dep.name)}
    out = []
    for p in list(state.pending):
        if p.window in running:
            continue  # the harvest ends it (under whichever term leads by then)
        if p.term != t.term:
            code, why = "leader-change", f"launched under term {p.term}; its launch was fenced by term {t.term}"
        elif p.generation != dep.settings.generation:
            code, why = "configuration-change", "the configuration changed before the window was swept"
        elif now >= p.at + dep.settings.time_budget_s:
            code, why = "lost-broker-state", ("no sweep of the window by its deadline: its message or sweep "
                                              "record was lost (a broker restart without persistence?)")
        else:
            continue
        if drop(dep, t, p.window, code, why, now) is not None:
            out.append({"window": p.window, "dropped": code})
    return out
