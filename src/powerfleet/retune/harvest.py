"""The harvest: decide a sweep with what arrived, after the search beyond the grid's edge.

When every shard is in and time remains, the harvest runs the next round of the same edge
search the local sweep runs (``grid.search_round``): the new points go out as one more
shard (kind ``search``) of the same sweep, and the harvest that follows its result looks
again. The decision comes when the search is over, or at the deadline with what arrived.
It is saved (fenced) before any router sees it, then actuated. The current leader harvests,
whichever term launched the sweep.
"""

from __future__ import annotations

import math
from typing import Any

from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.accounting import drop, outcome, record
from powerfleet.retune.context import Deployment, Ports
from powerfleet.retune.decision import Candidate, Decision, decide
from powerfleet.retune.fanin import FanIn, ShardResult, SweepRecord
from powerfleet.retune.grid import search_round
from powerfleet.retune.guard import Move, dwell_blocks
from powerfleet.retune.leadership import Fenced
from powerfleet.retune.live import SHARD_TASK, actuate
from powerfleet.retune.metrics import CANDIDATES, IMPROVEMENT, SWEEP_SECONDS, WINDOWS
from powerfleet.retune.premises import prefill_replicas, worker_replicas
from powerfleet.retune.state import DecisionRecord, Moved, RetuneState
from powerfleet.sim.policy import RouterPolicy


def _gather(rec: SweepRecord, results: dict[str, ShardResult]) -> tuple[Candidate | None, list[Candidate], int]:
    probe: Candidate | None = None
    cands: list[Candidate] = []
    missing = 0
    for sh in rec.shards:
        res = results.get(sh.key())
        if res is None:
            missing += len(sh.points)
            got = [Candidate(params=p, ok=False, reason="no result by the deadline") for p in sh.points]
        else:
            got = [Candidate.model_validate(c) for c in res.candidates]
        if sh.kind == "probe":
            probe = got[0] if res is not None else None
        else:
            cands.extend(c.model_copy(update={"origin": "search"}) if sh.kind == "search" else c for c in got)
    return probe, cands, missing



def _sweep_notes(extra: dict[str, Any]) -> str:
    """What the decision's reason says of how the window was swept, whatever it decided."""
    notes = ""
    if extra.get("shift"):  # scored from a load change inside the window (retune/shift.py)
        notes += f"; scored from the load change: {extra['shift']}"
    if extra.get("held_knobs"):  # grid knobs that cannot change this replay (retune/effect.py)
        notes += f"; held at the current value (no effect on this replay): {', '.join(extra['held_knobs'])}"
    return notes

def harvest(cfg: RetuneConfig, ports: Ports, sid: str) -> dict[str, Any]:
    """Decide a sweep with what arrived (all shards, or the deadline); save, then actuate."""
    now = ports.clock.now()
    fan = ports.fanin
    rec = fan.sweep(sid)
    if rec is None:
        return {"status": "unknown", "sid": sid, "reason": f"no sweep {sid!r} (never launched, or expired)"}
    if rec.status != "running":
        return {"status": rec.status, "sid": sid, "reason": rec.reason}
    if not fan.harvest_claim(sid, int(cfg.lease_duration_s)):
        return {"status": "busy", "sid": sid}
    try:
        dep = Deployment.open(cfg, ports, rec.dgd)
        # The current leader harvests, whichever term launched the sweep: shards that finished
        # under a previous leader are decided by the new one, not lost.
        lease = dep.leadership.current()
        if lease is None or lease.holder_identity != ports.identity:
            return {"status": "not-leader", "sid": sid, "holder": lease.holder_identity if lease else None}
        t = dep.term_of(ports.identity, lease.lease_transitions or 0)
        if dep.settings.generation != rec.generation:
            why = "configuration changed during the sweep"
            fan.finish(rec, "dropped", why)
            drop(dep, t, rec.window, "configuration-change", why, now)
            WINDOWS.labels(rec.dgd, "dropped", "configuration-change").inc()
            return {"status": "dropped", "reason": why}
        if rec.dgd_uid and rec.dgd_uid != dep.uid:
            why = f"the DGD was deleted or recreated during the sweep (uid {rec.dgd_uid}, now {dep.uid or 'none'})"
            fan.finish(rec, "dropped", why)
            state, _ = dep.store.read()
            if state is not None and state.dgd_uid == rec.dgd_uid:  # never into another object's history
                drop(dep, t, rec.window, "dgd-recreated", why, now)
            WINDOWS.labels(rec.dgd, "dropped", "dgd-recreated").inc()
            return {"status": "dropped", "reason": why}
        results = fan.results(rec)
        complete = len(results) == len(rec.shards)
        if not complete and now < rec.deadline:
            return {"status": "waiting", "arrived": len(results), "of": len(rec.shards)}
        if complete:
            searching = _search(dep, ports, fan, rec, results, now)
            if searching is not None:
                return searching
        probe, cands, missing = _gather(rec, results)
        adopted = fan.adopted(sid)
        verified = (dep.dgd is not None and worker_replicas(dep.dgd) == rec.replicas
                    and prefill_replicas(dep.dgd) == rec.prefill_replicas)
        common = dict(candidates=len(cands), candidates_failed=sum(1 for c in cands if not c.rankable()),
                      replicas=rec.replicas, replicas_verified=verified)
        for c in cands:
            CANDIDATES.labels(rec.dgd, "scored" if c.rankable() else ("missing" if c.reason == "no result by the deadline" else "failed")).inc()
        change = None
        if probe is None or (missing and not any(c.rankable() for c in cands)):
            why = f"sweep overran its time budget of {dep.settings.time_budget_s:g}s ({len(results)} of {len(rec.shards)} shards arrived" + ("; probe missing)" if probe is None else ")")
            dr = outcome(dep, t, rec.window, "abandoned", why, "time-budget", now, **common)
            status = "abandoned"
        elif not verified:
            dr = outcome(dep, t, rec.window, "abandoned", "worker replicas changed during the sweep", "replicas-changed",
                          now, **common)
            status = "abandoned"
        elif rec.dgd_generation is not None and dep.object_generation != rec.dgd_generation:
            dr = outcome(dep, t, rec.window, "abandoned", f"the DGD's spec changed during the sweep (generation "
                         f"{rec.dgd_generation} -> {dep.object_generation})", "dgd-changed", now, **common)
            status = "abandoned"
        else:
            g = dep.settings.guard
            d = decide(cands, probe, dep.settings.objective, dep.settings.min_improvement_pct, guard=g)
            state, _ = dep.store.read()
            moves = {p: Move(m.window, m.previous) for p, m in (state.moves if state else {}).items()}
            held = dwell_blocks(moves, rec.current, d.params, rec.window, g.dwell_windows) if d.action == "apply" else None
            what = d.action if rec.mode == "active" or d.action == "keep" else "advisory"
            reason = d.reason + _sweep_notes(rec.extra)
            if held:
                what, reason = "keep", f"keep: {d.reason.split(': ', 1)[-1]}, but {held}{_sweep_notes(rec.extra)}"
            dr = outcome(dep, t, rec.window, what, reason, None, now, params=d.params if not held else rec.current,
                          improvement_pct=d.improvement_pct, probe_score=probe.score,
                          best_score=d.best.score if d.best else None, confidence=d.confidence,
                          runner_up_margin_pct=d.runner_up_margin_pct, requests=d.requests,
                          ranking=_ranking(d), **common)
            status = "decided"
            if what == "apply":
                change = _apply_change(dr, rec.current)
            elif what == "advisory":
                change = _advisory_change(dr)
        try:
            saved = record(dep, t, dr, change)
        except Fenced as exc:  # leadership moved: the sweep stays open for the new leader's harvest
            return {"status": "fenced", "reason": str(exc)}
        SWEEP_SECONDS.labels(rec.dgd).observe(max(0.0, now - rec.launched_at))
        if saved is None:  # the window had its outcome already (dropped by a new leader?): that one stands
            why = f"window {rec.window} already has its recorded outcome; this harvest's {dr.outcome} was not saved"
            fan.finish(rec, "dropped", why)
            WINDOWS.labels(rec.dgd, "superseded", "outcome-recorded").inc()
            return {"status": "superseded", "reason": why, "window": rec.window, "saved": False,
                    "adopted_results": adopted}
        fan.finish(rec, "decided" if status == "decided" else "abandoned", dr.reason)
        WINDOWS.labels(rec.dgd, status, dr.failure_reason or dr.outcome).inc()
        if dr.outcome == "apply" and dr.improvement_pct is not None:
            IMPROVEMENT.labels(rec.dgd).set(dr.improvement_pct)
        out: dict[str, Any] = {"status": status, "outcome": dr.outcome, "reason": dr.reason, "window": rec.window,
                               "saved": saved is not None, "adopted_results": adopted, "params": dr.params}
        if saved is not None and saved.mode == "active" and dr.outcome == "apply":
            dep.event("RetuneApplied", f"window {rec.window}: applied {_knobs(dr.params)} "
                      f"({dr.improvement_pct:+.2f} % {dep.settings.objective.value}; {dr.reason})"
                      if dr.improvement_pct is not None else f"window {rec.window}: applied {_knobs(dr.params)}")
            out["routers"] = actuate(dep, ports, t, saved)
        return out
    finally:
        fan.harvest_release(sid)


def _apply_change(dr: DecisionRecord, current: dict[str, float]) -> Any:
    def change(s: RetuneState) -> RetuneState:
        moved = {p: Moved(window=dr.window, previous=current[p]) for p, v in (dr.params or {}).items()
                 if p in current and not math.isclose(v, current[p])}
        return s.model_copy(update={"desired": dict(dr.params or {}), "desired_window": dr.window,
                                    "rollback": "none", "moves": {**s.moves, **moved}})

    return change


RANKING_MAX = 5  # candidates kept per decision in the state (it must stay well under 256 KiB)


def _ranking(d: Decision) -> list[dict[str, Any]]:
    """The best candidates, best first: their knobs, score and origin (``retune status --json``)."""
    return [{"params": c.params, "score": c.score, "origin": c.origin} for c in d.ranked[:RANKING_MAX]]


def _advisory_change(dr: DecisionRecord) -> Any:
    return lambda s: s.model_copy(update={"advisory": dr.model_copy(deep=True)})




def _search(dep: Deployment, ports: Ports, fan: FanIn, rec: SweepRecord, results: dict[str, ShardResult],
            now: float) -> dict[str, Any] | None:
    """Send the next round of the edge search as one more shard; None when the search is over
    (or a round would not fit before the deadline)."""
    s = dep.settings
    if now + s.shard_timeout_s > rec.deadline:
        return None
    _, cands, _ = _gather(rec, results)
    cur = RouterPolicy.model_validate(rec.current)
    axes = s.grid.for_deployment(cur, disaggregated=rec.prefill_replicas is not None).axes(cur)
    new = search_round(axes, cands, s.objective, s.search, rec.search_rounds)
    if not new:
        return None
    grid = next(sh for sh in rec.shards if sh.kind != "probe")
    spec = grid.model_copy(update={"kind": "search", "index": rec.search_rounds, "points": [p.model_dump() for p in new]})
    rec = rec.model_copy(update={"shards": [*rec.shards, spec], "search_rounds": rec.search_rounds + 1})
    fan.save(rec)
    ports.send(SHARD_TASK, {"sid": rec.sid, "spec": spec.model_dump(mode="json")},
               {"soft_time_limit": s.shard_timeout_s, "time_limit": s.shard_timeout_s + 10})
    return {"status": "searching", "round": rec.search_rounds, "points": len(new), "sid": rec.sid}


def _knobs(params: dict[str, float] | None) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted((params or {}).items()))
