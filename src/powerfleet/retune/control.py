"""The leader's control round per deployment, and the operator's verbs.

``tick`` (every ``beat.retune_interval_s``) per configured deployment: claim or renew the
leadership Lease; on a new term (or a corrupt/missing state) rewrite the state under the new
term; follow mode and configuration changes; reconcile every router (manual changes are
reverted within one round); launch the newest closed window; harvest sweeps past their
deadline. ``promote``, ``rollback`` and ``apply`` are the same steps on demand. Disabling or
removing a deployment's retune rolls its routers back, then deletes its state, Leases and
sweep leftovers, and only while this process holds the term.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from powerfleet.cluster.ports import ClusterError
from powerfleet.cluster.router import TIMEOUT_S as PATCH_TIMEOUT_S
from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.accounting import LEGACY_ENABLED_AT, WINDOW_TASK, audit, launch_due  # noqa: F401  (WINDOW_TASK: re-exported)
from powerfleet.retune.context import Deployment, Ports
from powerfleet.retune.fanin import PREFIX
from powerfleet.retune.fencing import Barriers
from powerfleet.retune.leadership import Fenced, Leadership, Term
from powerfleet.retune.live import HARVEST_TASK, actuate
from powerfleet.retune.metrics import CORRUPT_STATE, TERM
from powerfleet.retune.settings import SettingsError, configured, resolve
from powerfleet.retune.state import DecisionRecord, RetuneState
from powerfleet.retune.windows import last_closed_window

ENABLED_AT = LEGACY_ENABLED_AT
LAST_LAUNCHED = "powerfleet:retune:last_launched"  # before the schedule moved into the state
KNOWN = PREFIX + "known"


class NotLeader(Exception):
    """Another process holds this deployment's Lease; the verb did nothing."""


def _lead(dep: Deployment) -> tuple[Term, RetuneState, str | None]:
    """Claim or renew; rewrite the state under a new term or when it is missing or corrupt."""
    t, holder, acquired = dep.leadership.claim()
    if t is None:
        TERM.labels(dep.name).set(0)
        raise NotLeader(f"{dep.name}: the retune Lease is held by {holder!r}")
    TERM.labels(dep.name).set(t.term)
    state, corrupt = dep.store.read()
    if corrupt:
        CORRUPT_STATE.labels(dep.name).inc()
    if state is not None and state.term > t.term:
        # The leadership Lease was recreated (deleted by hand) below the saved term: continue
        # above it, or every fenced write would refuse this leader forever.
        t = dep.leadership.raise_term(t, state.term + 1)
        TERM.labels(dep.name).set(t.term)
    uid = dep.uid
    if state is not None and uid and state.dgd_uid and state.dgd_uid != uid:
        # The DGD was deleted and recreated under the same name: nothing decided for the old
        # one (desired settings, windows, initial settings) belongs to the new one.
        since = dep.leadership.clock.now()
        state = dep.store.update(t, lambda s: RetuneState(term=t.term, dgd_uid=uid, dgd_since=since),
                                 replace_corrupt=True)
    elif acquired or corrupt or state is None or state.term != t.term or (uid and state.dgd_uid != uid):
        state = dep.store.update(t, lambda s: s.model_copy(update={"dgd_uid": uid or s.dgd_uid}),
                                 replace_corrupt=True)
    assert state is not None
    return t, state, corrupt


def _follow_config(dep: Deployment, t: Term, state: RetuneState) -> RetuneState:
    s = dep.settings
    if state.mode == "active" and s.mode == "advisory" and state.desired is not None:
        # Switching to advisory rolls every router back to its saved initial settings.
        state = dep.store.update(t, lambda x: x.model_copy(update={"mode": "advisory", "rollback": "intent"}))
    elif state.mode != s.mode:
        state = dep.store.update(t, lambda x: x.model_copy(update={"mode": s.mode}))
    if state.generation != s.generation:
        state = dep.store.update(t, lambda x: x.model_copy(update={"generation": s.generation}))
    return state


def _finish_rollback(dep: Deployment, t: Term, state: RetuneState, routers: list[dict[str, Any]],
                     now: float) -> RetuneState:
    """``done`` only when every router answered its initial settings twice: when first seen
    converged, and again once the PATCH timeout has passed (a stale PATCH in flight has landed
    or failed by then)."""
    if state.rollback != "intent":
        return state
    converged = bool(routers) and all(r["converged"] for r in routers)
    if not converged:
        if state.rollback_verify_at is None:
            return state
        return dep.store.update(t, lambda x: x.model_copy(update={"rollback_verify_at": None}))
    if state.rollback_verify_at is None:
        return dep.store.update(t, lambda x: x.model_copy(update={"rollback_verify_at": now + PATCH_TIMEOUT_S}))
    if now < state.rollback_verify_at:
        return state
    done = dep.store.update(t, lambda x: x.model_copy(update={"rollback": "done", "desired": None,
                                                              "desired_window": None, "rollback_verify_at": None}))
    dep.event("RetuneRolledBack", f"every router ({len(routers)}) is back on its initial settings, verified "
              f"after the PATCH timeout")
    return done


def tick_deployment(cfg: RetuneConfig, ports: Ports, name: str, now: float) -> dict[str, Any]:
    try:
        dep = Deployment.open(cfg, ports, name)
    except SettingsError as exc:
        return {"deployment": name, "status": "invalid-settings", "error": str(exc)}
    if not dep.settings.enabled:
        return cleanup(cfg, ports, dep)
    if dep.dgd_obj is None:  # deleted: its retune ends (state, Leases, leftovers), no loop
        return {**cleanup(cfg, ports, dep), "reason": "the DGD does not exist", "status": "dgd-missing"}
    try:
        t, state, corrupt = _lead(dep)
    except NotLeader as exc:
        return {"deployment": name, "status": "standby", "reason": str(exc)}
    ports.r.sadd(KNOWN, name)
    try:
        state = _follow_config(dep, t, state)
        routers = actuate(dep, ports, t, state)
        state = _finish_rollback(dep, t, state, routers, ports.clock.now())
        state, launched = launch_due(ports, dep, t, state, now)
        dropped = audit(ports, dep, t, state, now)
        # Harvest every sweep past its deadline or complete (a lost harvest message, or shards
        # that finished under a previous leader): the harvest counts results, so this is safe.
        fan = ports.fanin
        overdue = [rec.sid for rec in fan.active(name) if now >= rec.deadline or fan.complete(rec)]
        for sid in overdue:
            ports.send(HARVEST_TASK, {"sid": sid}, {})
    except Fenced as exc:
        TERM.labels(name).set(0)
        return {"deployment": name, "status": "fenced", "reason": str(exc)}
    return {"deployment": name, "status": "leader", "term": t.term, "mode": state.mode, "launched": launched,
            "harvest": overdue, "dropped": dropped, "routers": routers, "corrupt_state_replaced": corrupt}


def _guarded(cfg: RetuneConfig, ports: Ports, name: str, now: float) -> dict[str, Any]:
    """One deployment's round; an API failure fails that deployment's round only."""
    try:
        return tick_deployment(cfg, ports, name, now)
    except ClusterError as exc:
        return {"deployment": name, "status": "cluster-error", "error": str(exc)}


def tick(cfg: RetuneConfig, ports: Ports, now: float) -> list[dict[str, Any]]:
    names = set(configured(cfg))
    out = [_guarded(cfg, ports, n, now) for n in sorted(names)]
    for gone in sorted(m.decode() for m in ports.r.smembers(KNOWN)):
        if gone not in names:  # retune removed from the config: roll back and clean up
            try:
                out.append(cleanup(cfg, ports, Deployment.open(cfg, ports, gone)))
            except SettingsError as exc:
                out.append({"deployment": gone, "status": "invalid-settings", "error": str(exc)})
    return out


def cleanup(cfg: RetuneConfig, ports: Ports, dep: Deployment) -> dict[str, Any]:
    """Retune disabled or removed: roll routers back, then delete state, Leases and leftovers."""
    if dep.leadership.current() is None and dep.store.read() == (None, None):
        ports.r.srem(KNOWN, dep.name)
        return {"deployment": dep.name, "status": "disabled"}
    try:
        t, state, _ = _lead(dep)
    except NotLeader as exc:
        return {"deployment": dep.name, "status": "standby", "reason": str(exc)}
    try:
        if state.rollback != "done" and state.initial and dep.dgd_obj is not None:  # a deleted DGD has no routers
            if state.rollback != "intent":
                state = dep.store.update(t, lambda x: x.model_copy(update={"rollback": "intent"}))
            routers = actuate(dep, ports, t, state)
            state = _finish_rollback(dep, t, state, routers, ports.clock.now())
            if state.rollback != "done":
                return {"deployment": dep.name, "status": "rolling-back", "verify_at": state.rollback_verify_at,
                        "routers": routers}
        purged = ports.fanin.purge(dep.name)
        Barriers(ports.r, dep.name).purge()
        dep.store.delete(t)
    except Fenced as exc:
        return {"deployment": dep.name, "status": "fenced", "reason": str(exc)}
    ports.r.hdel(ENABLED_AT, dep.name)
    ports.r.hdel(LAST_LAUNCHED, dep.name)
    ports.r.srem(KNOWN, dep.name)
    TERM.labels(dep.name).set(0)
    return {"deployment": dep.name, "status": "cleaned", "results_deleted": purged}


Verb = Callable[[Deployment, Ports, Term, RetuneState], dict[str, Any]]


def _as_leader(body: Verb) -> Callable[[RetuneConfig, Ports, str], dict[str, Any]]:
    """An operator verb runs only as the leader, and stops (reporting why) when fenced."""

    @functools.wraps(body)
    def run(cfg: RetuneConfig, ports: Ports, name: str) -> dict[str, Any]:
        if name not in configured(cfg) and not ports.r.sismember(KNOWN, name):
            # No Lease is taken for a typo (`reset-window --dgd nosuch` used to answer "unchanged").
            return {"deployment": name, "status": "unknown",
                    "reason": f"{name!r} is not a retuned deployment (not in retune.deployments or "
                              "retune.per_deployment)"}
        dep = Deployment.open(cfg, ports, name)
        try:
            t, state, _ = _lead(dep)
            return body(dep, ports, t, state)
        except NotLeader as exc:
            return {"deployment": name, "status": "not-leader", "reason": str(exc)}
        except Fenced as exc:
            return {"deployment": name, "status": "fenced", "reason": str(exc)}

    return run


@_as_leader
def promote(dep: Deployment, ports: Ports, t: Term, state: RetuneState) -> dict[str, Any]:
    """Apply the last advisory recommendation to every router (once, even in advisory mode)."""
    adv = state.advisory
    if adv is None or adv.params is None:
        return {"deployment": dep.name, "status": "nothing-to-promote"}
    now = ports.clock.now()
    s = dep.settings
    later = [h.window for h in state.history if h.window > adv.window and h.outcome == "keep"]
    if later:
        return {"deployment": dep.name, "status": "refused", "window": adv.window,
                "reason": f"superseded: window {max(later)} decided to keep the settings after window {adv.window}"}
    # Age in windows launched since (the state's own clock of windows, not the wall clock).
    newest = max(w for w in (state.last_launched, state.last_window, adv.window) if w is not None)
    age = newest - adv.window
    if age > s.promote_max_age_windows:
        return {"deployment": dep.name, "status": "refused", "window": adv.window,
                "reason": f"the recommendation of window {adv.window} is {age} windows old "
                          f"(retune.promote_max_age_windows {s.promote_max_age_windows})"}
    rec = DecisionRecord(window=-1, outcome="promoted", mode=state.mode, params=dict(adv.params),
                         improvement_pct=adv.improvement_pct, reason=f"promoted the advisory decision of window {adv.window}",
                         term=t.term, generation=dep.settings.generation, at=now)
    state = dep.store.update(t, lambda x: x.with_decision(rec, dep.settings.history).model_copy(update={
        "desired": dict(adv.params or {}), "desired_window": adv.window, "advisory": None, "rollback": "none"}))
    routers = actuate(dep, ports, t, state, promote=state.desired)
    return {"deployment": dep.name, "status": "promoted", "window": adv.window, "params": adv.params, "routers": routers}


@_as_leader
def rollback(dep: Deployment, ports: Ports, t: Term, state: RetuneState) -> dict[str, Any]:
    """Two phases: save the intent, then write each router's initial settings (revision-checked)."""
    now = ports.clock.now()
    rec = DecisionRecord(window=-1, outcome="rollback", mode=state.mode, reason="rollback to the initial settings",
                         term=t.term, generation=dep.settings.generation, at=now)
    if state.rollback != "intent":  # a repeated call continues the rollback under way
        state = dep.store.update(t, lambda x: x.with_decision(rec, dep.settings.history).model_copy(
            update={"rollback": "intent"}))
    routers = actuate(dep, ports, t, state)
    state = _finish_rollback(dep, t, state, routers, ports.clock.now())
    return {"deployment": dep.name, "status": "rolled-back" if state.rollback == "done" else "rolling-back",
            "verify_at": state.rollback_verify_at, "routers": routers}


@_as_leader
def apply_now(dep: Deployment, ports: Ports, t: Term, state: RetuneState) -> dict[str, Any]:
    """One reconcile round now: write the decided settings (active mode), report convergence."""
    state = _follow_config(dep, t, state)
    routers = actuate(dep, ports, t, state)
    state = _finish_rollback(dep, t, state, routers, ports.clock.now())
    return {"deployment": dep.name, "status": "reconciled", "mode": state.mode, "desired": state.desired,
            "routers": routers}


@_as_leader
def reset_window(dep: Deployment, ports: Ports, t: Term, state: RetuneState) -> dict[str, Any]:
    """Reset the window record to the newest window really decided that has closed (or none).

    A record beyond the newest closed window (a hand-sent future window before the bound
    existed) would refuse every real window as already decided; this verb repairs it."""
    s = dep.settings
    closed = last_closed_window(ports.clock.now(), s.interval_s, s.phase_s).index
    decided = [h.window for h in state.history if 0 <= h.window <= closed]
    before, after = state.last_window, (max(decided) if decided else None)
    launched = state.last_launched if state.last_launched is None or state.last_launched <= closed else after
    if before != after or launched != state.last_launched:
        dep.store.update(t, lambda x: x.model_copy(update={
            "last_window": after, "last_launched": launched,
            "pending": [p for p in x.pending if p.window <= closed]}))
    return {"deployment": dep.name, "status": "reset" if before != after else "unchanged",
            "last_window": after, "was": before, "newest_closed": closed}


def release_all(cfg: RetuneConfig, ports: Ports) -> list[str]:
    """Graceful shutdown: give up every Lease this process holds -- of configured deployments
    and of those removed from the config whose clean-up has not finished (``KNOWN``)."""
    names = set(configured(cfg))
    try:
        names |= {m.decode() if isinstance(m, bytes) else m for m in ports.r.smembers(KNOWN)}
    except Exception:  # Redis gone at shutdown: the configured ones are still released
        pass
    out = []
    for name in sorted(names):  # the Lease alone: no DGD read on the way out
        try:
            base = resolve(cfg, name)
        except SettingsError:
            continue
        lead = Leadership(ports.cluster, cfg.namespace, name, ports.identity, duration_s=base.lease_duration_s,
                          clock=ports.clock)
        if lead.release():
            out.append(name)
    return out


