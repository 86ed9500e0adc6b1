"""One retune window, step by step: launch (premises, cut, shards), shard, harvest (decide).

Every step is idempotent and checks that the work still belongs to the current leader term
and configuration generation; work from a superseded term or generation is dropped, so the
sweeps of an old and a new configuration never run at once. The decision is saved (fenced)
before any router sees it.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.accounting import drop, outcome, record
from powerfleet.retune.actuator import Actuator, FrontendReport
from powerfleet.retune.context import Deployment, Ports
from powerfleet.retune.cut import CutError, cut_window
from powerfleet.retune.decision import Candidate, decide
from powerfleet.retune.fencing import Barriers
from powerfleet.retune.fanin import ShardResult, ShardSpec, SweepRecord, file_sha256, sweep_id
from powerfleet.retune.grid import split_shards
from powerfleet.retune.leadership import Fenced, Term
from powerfleet.retune.metrics import (CANDIDATES, CONVERGED, CORRUPT_STATE, DECISIONS, IMPROVEMENT, ROUTERS,
                                       SWEEP_SECONDS, WINDOWS)
from powerfleet.retune.premises import check, worker_replicas
from powerfleet.retune.state import DecisionRecord, RetuneState
from powerfleet.retune.sweep import run_shard_from_trace
from powerfleet.retune.windows import last_closed_window, window
from powerfleet.sim.policy import RouterPolicy

SHARD_TASK = "powerfleet.sweep.shard"
HARVEST_TASK = "powerfleet.retune.harvest"


def current_settings(dep: Deployment, state: RetuneState | None, policies: dict[str, dict[str, float]]) -> dict[str, float]:
    """The settings the routers hold (what the probe replays)."""
    if state is not None and state.mode == "active" and state.desired is not None and state.rollback != "intent":
        return dict(state.desired)
    for pod in sorted(policies):
        return dict(policies[pod])
    return RouterPolicy().model_dump()


def launch_window(cfg: RetuneConfig, ports: Ports, dgd: str, k: int, *, leader: str | None = None,
                  term: int | None = None, generation: str | None = None) -> dict[str, Any]:
    now = ports.clock.now()
    dep = Deployment.open(cfg, ports, dgd)
    s = dep.settings
    closed = last_closed_window(now, s.interval_s, s.phase_s).index
    if k > closed:  # the task's model refuses it too; a window not over must never be recorded
        WINDOWS.labels(dgd, "refused", "not-closed").inc()
        return {"status": "refused", "reason": f"window {k} has not closed yet (the newest closed window is {closed})"}
    if term is None or leader is None:
        t, holder, _ = dep.leadership.claim()
        if t is None:
            return {"status": "not-leader", "holder": holder}
    else:
        t = dep.term_of(leader, term)
        try:
            dep.leadership.check(t)
        except Fenced as exc:
            WINDOWS.labels(dgd, "dropped", "term").inc()
            return {"status": "dropped", "reason": str(exc)}
    if generation is not None and generation != s.generation:
        WINDOWS.labels(dgd, "dropped", "generation").inc()
        return {"status": "dropped", "reason": f"configuration generation {generation} was superseded by {s.generation}"}
    state, corrupt = dep.store.read()
    if corrupt:  # this step acts under a checked term: replace the corrupt state, as a claim would
        CORRUPT_STATE.labels(dgd).inc()
        state = dep.store.update(t, lambda x: x, replace_corrupt=True)
    if state is not None and state.decided(k):
        return {"status": "already-decided", "window": k}
    opts = {"soft_time_limit": s.shard_timeout_s, "time_limit": s.shard_timeout_s + 10}
    existing = ports.fanin.sweep(sweep_id(dgd, k, s.generation, t.term))
    if existing is not None:
        # A redelivered launch: never re-cut (shards may be reading the file); re-send the
        # recorded shards, which adopt the results that exist.
        if existing.status == "running":
            for sh in existing.shards:
                ports.send(SHARD_TASK, {"sid": existing.sid, "spec": sh.model_dump(mode="json")}, opts)
        return {"status": "resent" if existing.status == "running" else existing.status, "sid": existing.sid}
    for old in ports.fanin.active(dgd):
        if old.generation != s.generation:  # never two configurations' sweeps at once
            why = "superseded by a newer configuration before its harvest"
            ports.fanin.finish(old, "dropped", why)
            drop(dep, t, old.window, "configuration-change", why, now)
            WINDOWS.labels(dgd, "dropped", "configuration-change").inc()
    w = window(k, s.interval_s, s.phase_s)
    snap = dep.snapshot(ports)
    failed = check(s, snap, initial=state.initial if state is not None else None)
    if failed:
        codes = ",".join(sorted({p.code for p in failed}))
        reason = "; ".join(str(p) for p in failed)
        record(dep, t, outcome(dep, t, k, "abandoned", f"blocked: {reason}", codes, now))
        WINDOWS.labels(dgd, "blocked", codes).inc()
        return {"status": "blocked", "premises": [p.code for p in failed], "reason": reason}
    t0 = time.monotonic()
    try:
        cut = cut_window(s.trace_dir, dgd, k, w.start, w.end)
    except (CutError, OSError) as exc:
        record(dep, t, outcome(dep, t, k, "abandoned", f"window cut failed: {exc}", "cut-failed", now))
        WINDOWS.labels(dgd, "abandoned", "cut-failed").inc()
        return {"status": "abandoned", "reason": str(exc)}
    cut_info = {"requests": cut.requests, "segments": cut.segments, "corrupt_members": cut.corrupt_members,
                "malformed_lines": cut.malformed_lines, "cut_seconds": round(time.monotonic() - t0, 3)}
    if cut.path is None:
        record(dep, t, outcome(dep, t, k, "no-traffic", "no traffic in the window", None, now))
        WINDOWS.labels(dgd, "decided", "no-traffic").inc()
        return {"status": "no-traffic", **cut_info}
    assert snap.dgd is not None
    replicas = worker_replicas(snap.dgd)
    current = current_settings(dep, state, snap.frontend_policies)
    points = s.grid.points(RouterPolicy.model_validate(current))
    digest = file_sha256(cut.path)
    sid = sweep_id(dgd, k, s.generation, t.term)
    ref = cut.path
    if s.window_store == "redis":  # no shared volume: shards fetch the window from Redis
        ref = ports.fanin.put_window(sid, cut.path, int(s.time_budget_s + s.interval_s))
        os.unlink(cut.path)

    def spec(kind: str, i: int, pts: list[dict[str, float]]) -> ShardSpec:
        return ShardSpec(dgd=dgd, window=k, window_file=ref, window_sha256=digest, kind=kind,  # type: ignore[arg-type]
                         index=i, points=pts, objective=s.objective.value, sla=s.sla, replicas=replicas)

    shards = [spec("probe", 0, [current])]
    shards += [spec("shard", i, [p.model_dump() for p in sh]) for i, sh in enumerate(split_shards(points, s.max_shards))]
    rec = SweepRecord(sid=sid, dgd=dgd, window=k, term=t.term,
                      identity=t.identity, generation=s.generation, mode=s.mode, launched_at=now,
                      deadline=now + s.time_budget_s, window_file=ref, requests=cut.requests,
                      replicas=replicas, current=current, shards=shards, extra=cut_info)
    if not ports.fanin.register(rec):  # a concurrent duplicate launch registered first
        return {"status": "resent", "sid": rec.sid}
    for sh in shards:
        ports.send(SHARD_TASK, {"sid": rec.sid, "spec": sh.model_dump(mode="json")}, opts)
    WINDOWS.labels(dgd, "launched", "").inc()
    return {"status": "launched", "sid": rec.sid, "shards": len(shards), "points": len(points), **cut_info,
            "corrupt_state": corrupt}


def run_shard(ports: Ports, sid: str, spec: ShardSpec, *, redelivered: bool = False) -> dict[str, Any]:
    """One shard (or the probe). Adopts an existing result for the same spec instead of recomputing."""
    fan = ports.fanin
    rec = fan.sweep(sid)
    if rec is None or rec.status != "running":
        if rec is not None:  # a late retry of a killed shard: its stale reader entry goes, then the file
            fan.read_done(sid, spec.key())
            fan.gc_window_file(rec)
        return {"status": "dropped", "reason": "the sweep is final or unknown"}
    if spec not in rec.shards:
        return {"status": "dropped", "reason": "spec is not part of the sweep"}
    key = spec.key()
    if fan.adoptable(spec) is not None:
        fan.count_adopted(sid)
        status = "adopted"
    else:
        who = f"{socket.gethostname()}:{os.getpid()}"
        fan.reading(sid, key, who)
        t0 = time.monotonic()
        err = None
        cands: list[dict[str, Any]] = []
        try:
            with fan.window_path(spec.window_file, spec.window_sha256) as path:
                got = run_shard_from_trace(path, spec.replicas, spec.points, objective=spec.objective, seed=spec.seed,
                                           sla=spec.sla, shard=None if spec.kind == "probe" else spec.index)
            cands = [c.model_dump() for c in got]
        except Exception as exc:  # a failing shard fails only its own candidates
            err = f"{type(exc).__name__}: {exc}"
            cands = [Candidate(params=p, ok=False, reason=f"shard failed: {err}").model_dump() for p in spec.points]
        fan.store(ShardResult(key=key, spec=spec, candidates=cands, error=err,
                              host=who, seconds=time.monotonic() - t0))
        fan.read_done(sid, key)
        status = "failed" if err else "computed"
    done = fan.mark_done(sid, key)
    if done >= len(rec.shards):
        ports.send(HARVEST_TASK, {"sid": sid}, {})
    return {"status": status, "key": key, "done": done, "of": len(rec.shards), "redelivered": redelivered}


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
            cands.extend(got)
    return probe, cands, missing


def harvest(cfg: RetuneConfig, ports: Ports, sid: str) -> dict[str, Any]:
    """Decide a sweep with what arrived (all shards, or the deadline); save, then actuate."""
    now = ports.clock.now()
    fan = ports.fanin
    rec = fan.sweep(sid)
    if rec is None:
        return {"status": "unknown", "sid": sid}
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
        results = fan.results(rec)
        complete = len(results) == len(rec.shards)
        if not complete and now < rec.deadline:
            return {"status": "waiting", "arrived": len(results), "of": len(rec.shards)}
        probe, cands, missing = _gather(rec, results)
        adopted = fan.adopted(sid)
        verified = dep.dgd is not None and worker_replicas(dep.dgd) == rec.replicas
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
        else:
            d = decide(cands, probe, dep.settings.objective, dep.settings.min_improvement_pct)
            what = d.action if rec.mode == "active" or d.action == "keep" else "advisory"
            dr = outcome(dep, t, rec.window, what, d.reason, None, now, params=d.params,
                          improvement_pct=d.improvement_pct, probe_score=probe.score,
                          best_score=d.best.score if d.best else None, **common)
            status = "decided"
            if what == "apply":
                change = _apply_change(dr)
                if d.improvement_pct is not None:
                    IMPROVEMENT.labels(rec.dgd).set(d.improvement_pct)
            elif what == "advisory":
                change = _advisory_change(dr)
        try:
            saved = record(dep, t, dr, change)
        except Fenced as exc:  # leadership moved: the sweep stays open for the new leader's harvest
            return {"status": "fenced", "reason": str(exc)}
        fan.finish(rec, "decided" if status == "decided" else "abandoned", dr.reason)
        SWEEP_SECONDS.labels(rec.dgd).observe(max(0.0, now - rec.launched_at))
        WINDOWS.labels(rec.dgd, status, dr.failure_reason or dr.outcome).inc()
        out: dict[str, Any] = {"status": status, "outcome": dr.outcome, "reason": dr.reason, "window": rec.window,
                               "saved": saved is not None, "adopted_results": adopted, "params": dr.params}
        if saved is not None and saved.mode == "active" and dr.outcome == "apply":
            out["routers"] = actuate(dep, ports, t, saved)
        return out
    finally:
        fan.harvest_release(sid)


def _apply_change(dr: DecisionRecord) -> Any:
    return lambda s: s.model_copy(update={"desired": dict(dr.params or {}), "desired_window": dr.window,
                                          "rollback": "none"})


def _advisory_change(dr: DecisionRecord) -> Any:
    return lambda s: s.model_copy(update={"advisory": dr.model_copy(deep=True)})


def actuate(dep: Deployment, ports: Ports, t: Term, state: RetuneState,
            promote: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One actuation round over every frontend; returns the per-frontend convergence report."""
    snap = dep.snapshot(ports, with_consumers=False)
    reports: list[FrontendReport]
    act = Actuator(ports.router, dep.store, dep.leadership, t, Barriers(ports.r, dep.name))
    _, reports = act.reconcile(snap.frontends, state, promote)
    CONVERGED.labels(dep.name).set(sum(1 for r in reports if r.converged))
    ROUTERS.labels(dep.name).set(len(reports))
    return [{"pod": r.pod, "converged": r.converged, "wrote": r.wrote, "revision": r.revision, "error": r.error}
            for r in reports]
