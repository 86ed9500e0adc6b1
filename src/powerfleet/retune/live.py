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
from powerfleet.retune.decision import Candidate
from powerfleet.retune.fencing import Barriers
from powerfleet.retune.fanin import DisaggSpec, ShardResult, ShardSpec, SweepRecord, file_sha256, sweep_id
from powerfleet.retune.grid import split_shards
from powerfleet.retune.leadership import Fenced, Term
from powerfleet.retune.metrics import APPLIED, CONVERGED, CORRUPT_STATE, ROUTERS, WINDOWS
from powerfleet.retune.premises import check, prefill_replicas, worker_replicas
from powerfleet.retune.settings import DeploymentSettings
from powerfleet.retune.shift import Shift, change_inside
from powerfleet.retune.state import RetuneState
from powerfleet.retune.sweep import run_shard_from_trace
from powerfleet.retune.windows import last_closed_window, window
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.trace import read_trace

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
    """One window's step: decide it at once (blocked, no traffic, cut failed) or cut it and launch
    its sweep. A term lost anywhere in the step (a handover, or the leader's Lease released by a
    shutdown while the step runs) drops the window, recorded like the term checks' drops; before,
    one lost between the checks (a state write) raised out of the task."""
    try:
        return _launch_window(cfg, ports, dgd, k, leader=leader, term=term, generation=generation)
    except Fenced as exc:
        WINDOWS.labels(dgd, "dropped", "term").inc()
        return {"status": "dropped", "reason": str(exc)}


def _launch_window(cfg: RetuneConfig, ports: Ports, dgd: str, k: int, *, leader: str | None,
                   term: int | None, generation: str | None) -> dict[str, Any]:
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
        dep.leadership.check(t)  # a superseded term drops the window (launch_window)
    if generation is not None and generation != s.generation:
        WINDOWS.labels(dgd, "dropped", "generation").inc()
        return {"status": "dropped", "reason": f"configuration generation {generation} was superseded by {s.generation}"}
    state, corrupt = dep.store.read()
    if corrupt:  # this step acts under a checked term: replace the corrupt state, as a claim would
        CORRUPT_STATE.labels(dgd).inc()
        state = dep.store.update(t, lambda x: x, replace_corrupt=True)
    if state is not None and state.decided(k):
        return {"status": "already-decided", "window": k}
    if state is not None and state.dgd_uid and dep.uid and state.dgd_uid != dep.uid:
        # The DGD was recreated since the tick that sent this step: its next tick starts the new
        # object's state; this window belongs to neither.
        WINDOWS.labels(dgd, "dropped", "dgd-recreated").inc()
        return {"status": "dropped", "reason": f"the DGD was recreated (uid {dep.uid}, the state's {state.dgd_uid})"}
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
        cut = cut_window(s.trace_dir, dgd, k, w.start, w.end, warmup_s=s.interval_s,  # warm start: the window before
                         retention_s=cfg.segment_retention_s, now_s=now,
                         not_before_s=state.dgd_since if state is not None else None)
    except (CutError, OSError) as exc:
        record(dep, t, outcome(dep, t, k, "abandoned", f"window cut failed: {exc}", "cut-failed", now))
        WINDOWS.labels(dgd, "abandoned", "cut-failed").inc()
        return {"status": "abandoned", "reason": str(exc)}
    cut_info = {"requests": cut.requests, "warmup_requests": cut.warmup_requests, "segments": cut.segments,
                "segments_skipped": cut.segments_skipped, "segments_pruned": cut.segments_pruned, "corrupt_members": cut.corrupt_members,
                "malformed_lines": cut.malformed_lines, "cut_seconds": round(time.monotonic() - t0, 3)}
    if cut.path is None:
        record(dep, t, outcome(dep, t, k, "no-traffic", "no traffic in the window", None, now))
        WINDOWS.labels(dgd, "decided", "no-traffic").inc()
        return {"status": "no-traffic", **cut_info}
    assert snap.dgd is not None
    replicas = worker_replicas(snap.dgd)
    prefill = prefill_replicas(snap.dgd)  # a disaggregated deployment: replayed as its two pools
    disagg = None if prefill is None else DisaggSpec(prefill_replicas=prefill, prefill_profile=s.prefill_engine_profile,
                                                     kv_transfer_gb_s=s.kv_transfer_gb_s)
    current = current_settings(dep, state, snap.frontend_policies)
    cur = RouterPolicy.model_validate(current)
    points = s.grid.for_deployment(cur, disaggregated=disagg is not None).points(cur)
    held = s.grid.held_knobs(cur, disaggregated=disagg is not None)
    if held:  # shown in the decision's reason: why the scale was not swept
        cut_info["held_knobs"] = held
    # A load change inside the window: score from it (the traffic before it warms up), so the
    # decision describes the traffic that will follow, not a mix of two regimes.
    shift = _change_in(cut.path, w.start, w.end, s)
    if shift is not None:
        cut_info["shift"] = f"{shift}, {shift.at_s - w.start:g} s into the window"
        cut_info["scored_from"] = shift.at_s
    digest = file_sha256(cut.path)
    sid = sweep_id(dgd, k, s.generation, t.term)
    ref = cut.path
    if s.window_store == "redis":  # no shared volume: shards fetch the window from Redis
        ref = ports.fanin.put_window(sid, cut.path, int(s.time_budget_s + s.interval_s))
        os.unlink(cut.path)

    # Scoring starts at the window's start, measured from the file's first record (the
    # warm-up span lies before it); the warm-up is replayed once under the current settings.
    scored_from = shift.at_s if shift is not None else w.start
    start_s = max(0.0, (scored_from * 1000.0 - (cut.first_ms if cut.first_ms is not None else scored_from * 1000.0)) / 1000.0)

    def spec(kind: str, i: int, pts: list[dict[str, float]]) -> ShardSpec:
        return ShardSpec(dgd=dgd, window=k, window_file=ref, window_sha256=digest, kind=kind,  # type: ignore[arg-type]
                         index=i, points=pts, objective=s.objective.value, sla=s.sla, replicas=replicas,
                         start_s=start_s, warm_policy=dict(current) if start_s > 0 else None,
                         profile=s.engine_profile, disagg=disagg, dgd_uid=dep.uid)

    shards = [spec("probe", 0, [current])]
    shards += [spec("shard", i, [p.model_dump() for p in sh]) for i, sh in enumerate(split_shards(points, s.max_shards))]
    rec = SweepRecord(sid=sid, dgd=dgd, window=k, term=t.term,
                      identity=t.identity, generation=s.generation, mode=s.mode, launched_at=now,
                      deadline=now + s.time_budget_s, window_file=ref, requests=cut.requests,
                      replicas=replicas, prefill_replicas=prefill, dgd_uid=dep.uid,
                      dgd_generation=dep.object_generation, current=current, shards=shards, extra=cut_info)
    try:  # the term again, right before the sweep exists: a handover during the cut drops it here
        dep.leadership.check(t)
    except Fenced:
        if s.window_store != "redis":
            os.unlink(cut.path)
        raise  # dropped by launch_window, as every lost term in the step
    if not ports.fanin.register(rec):  # a concurrent duplicate launch registered first
        return {"status": "resent", "sid": rec.sid}
    for sh in shards:
        ports.send(SHARD_TASK, {"sid": rec.sid, "spec": sh.model_dump(mode="json")}, opts)
    WINDOWS.labels(dgd, "launched", "").inc()
    return {"status": "launched", "sid": rec.sid, "shards": len(shards), "points": len(points), **cut_info,
            "corrupt_state": corrupt}


def _change_in(path: str, start: float, end: float, s: DeploymentSettings) -> Shift | None:
    """``shift.change_inside`` on the cut window file (epoch seconds; the warm-up before it)."""
    if s.shift is None:
        return None
    reqs = read_trace(path).requests
    return change_inside([r.timestamp_ms / 1000.0 for r in reqs], [r.input_length for r in reqs], start, end,
                         float(s.interval_s), s.shift, s.guard.min_requests)


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
                                           sla=spec.sla, shard=None if spec.kind == "probe" else spec.index,
                                           warmup_s=spec.start_s or None, warmup_policy=spec.warm_policy,
                                           profile=spec.profile, cache_key=spec.window_sha256,
                                           disagg=spec.disagg.model_dump() if spec.disagg is not None else None)
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


def actuate(dep: Deployment, ports: Ports, t: Term, state: RetuneState,
            promote: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One actuation round over every frontend; returns the per-frontend convergence report."""
    if state.dgd_uid and dep.uid != state.dgd_uid:
        # Decided for another object of this name (deleted, or deleted and recreated): its
        # routers are not this state's to write.
        return [{"pod": None, "converged": False, "wrote": False, "revision": None,
                 "error": f"the state belongs to DGD uid {state.dgd_uid}, not {dep.uid or 'none'}: no PATCH"}]
    snap = dep.snapshot(ports, with_consumers=False)
    reports: list[FrontendReport]
    act = Actuator(ports.router, dep.store, dep.leadership, t, Barriers(ports.r, dep.name))
    present = {f.pod for f in snap.frontends} | set(snap.frontends_without_url)
    _, reports = act.reconcile(snap.frontends, state, promote, present if snap.dgd is not None else None)
    for param, value in sorted((state.desired or {}).items()) if state.mode == "active" else ():
        APPLIED.labels(dep.name, param).set(value)
    CONVERGED.labels(dep.name).set(sum(1 for r in reports if r.converged))
    ROUTERS.labels(dep.name).set(len(reports))
    return [{"pod": r.pod, "converged": r.converged, "wrote": r.wrote, "revision": r.revision, "error": r.error}
            for r in reports]
