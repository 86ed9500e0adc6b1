"""Run a sweep locally: shards of grid points plus one probe, each a trace replay.

Every candidate and the probe replay the same prepared arrivals with the same seed
(common random numbers), so the probe's score equals ``sim replay`` with the same trace,
window, seed and settings, and scores compare fairly. This module only orchestrates; the
pure parts are ``grid.split_shards``, ``objectives.score`` and ``decision.decide``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from powerfleet.retune.decision import Candidate, Decision, decide
from powerfleet.retune.grid import SweepGrid, split_shards
from powerfleet.retune.objectives import DIRECTION, UNITS, Objective, parse_objective, score
from powerfleet.sim.engine import EngineConfig
from powerfleet.sim.policy import SLA, RouterPolicy
from powerfleet.sim.profile import TimingProfile
from powerfleet.sim.replay import Arrivals, prepare, replay_arrivals
from powerfleet.sim.summary import VersionedJson
from powerfleet.sim.trace import TraceRequest

SWEEP_SCHEMA = "powerfleet.retune.sweep/v1"


class SweepResult(VersionedJson):
    schema_: str = SWEEP_SCHEMA
    objective: str
    direction: str
    units: str
    workers: int
    seed: int
    shards: int
    grid_points: int
    candidates: list[Candidate]
    probe: Candidate
    decision: Decision

    def to_json_dict(self) -> dict[str, Any]:
        d = super().to_json_dict()
        dec = d["decision"]
        # the contract's decision object: action, params, improvement_pct, reason (+ context)
        d["decision"] = {
            "action": dec["action"],
            "params": dec["params"],
            "improvement_pct": dec["improvement_pct"],
            "reason": dec["reason"],
            "best_score": dec["best"]["score"] if dec["best"] else None,
            "min_improvement_pct": dec["min_improvement_pct"],
            "ranked": [i for i, c in _ranked_index(d["candidates"], dec["ranked"])],
        }
        d["probe"] = {k: d["probe"][k] for k in ("params", "score", "ok", "reason")}
        return d


def _ranked_index(cands: list[dict[str, Any]], ranked: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    pos = {}
    for i, c in enumerate(cands):
        pos.setdefault(_key(c["params"]), []).append(i)
    out = []
    for c in ranked:
        i = pos[_key(c["params"])].pop(0)
        out.append((i, c))
    return out


def _key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(params.items()))


def evaluate(
    arr: Arrivals,
    workers: int,
    policy: RouterPolicy,
    seed: int,
    objective: Objective,
    sla: SLA | None = None,
    profile: TimingProfile | None = None,
    shard: int | None = None,
    engine: EngineConfig | None = None,
) -> Candidate:
    """Replay one setting and score it (a failed score is a candidate with ``ok`` false)."""
    summary = replay_arrivals(arr, workers, policy, seed, sla=sla, profile=profile, engine=engine)
    res = score(summary, objective, sla)
    return Candidate(params=policy.model_dump(), score=res.score, ok=res.ok, reason=res.reason, shard=shard)


def run_shard(
    arr: Arrivals,
    workers: int,
    points: Sequence[RouterPolicy],
    seed: int,
    objective: Objective | str,
    sla: SLA | None = None,
    shard: int | None = None,
    profile: TimingProfile | None = None,
    engine: EngineConfig | None = None,
) -> list[Candidate]:
    """What one shard task does: replay and score its points in order."""
    obj = parse_objective(objective) if isinstance(objective, str) else objective
    return [evaluate(arr, workers, p, seed, obj, sla, profile, shard, engine) for p in points]


def run_shard_from_trace(
    trace_path: str,
    workers: int,
    points: Sequence[dict[str, Any]],
    *,
    objective: Objective | str,
    seed: int = 0,
    sla: dict[str, Any] | None = None,
    window: tuple[float | None, float | None] | None = None,
    shard: int | None = None,
    engine: dict[str, Any] | None = None,
) -> list[Candidate]:
    """JSON-in, models-out entry for a shard (or probe: one point) task.

    ``points`` are policy dicts (any subset of the eight parameters); the trace is read
    (non-strict) and cut exactly as ``run_sweep``/``sim replay`` do, so scores match.
    """
    from powerfleet.sim.engine import parse_engine
    from powerfleet.sim.policy import parse_policy, parse_sla
    from powerfleet.sim.trace import read_trace

    pols = [parse_policy(p) for p in points]
    arr = prepare(read_trace(trace_path).requests, seed=seed, window=window)
    return run_shard(arr, workers, pols, seed, objective, parse_sla(sla), shard, None, parse_engine(engine))


_STATE: dict[str, Any] = {}


def _init(state: dict[str, Any]) -> None:
    _STATE.clear()
    _STATE.update(state)


def _task(shard: int | None, points: list[RouterPolicy]) -> list[Candidate]:
    s = _STATE
    return run_shard(
        s["arr"], s["workers"], points, s["seed"], s["objective"], s["sla"], shard, s["profile"], s["engine"]
    )


def run_sweep(
    requests: Sequence[TraceRequest],
    workers: int,
    objective: Objective | str,
    current: RouterPolicy,
    grid: SweepGrid,
    *,
    max_shards: int = 3,
    min_improvement_pct: float = 0.0,
    window: tuple[float | None, float | None] | None = None,
    seed: int = 0,
    sla: SLA | None = None,
    processes: int | None = None,
    profile: TimingProfile | None = None,
    engine: EngineConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Replay every grid point and the probe in a local process pool, then decide."""
    obj = parse_objective(objective) if isinstance(objective, str) else objective
    points = grid.points(current)
    shards = split_shards(points, max_shards)
    arr = prepare(requests, seed=seed, window=window)
    state = dict(arr=arr, workers=workers, seed=seed, objective=obj, sla=sla, profile=profile, engine=engine)
    # Work items: the probe first, then each shard cut into small pieces so the pool stays
    # balanced and the progress bar moves; results are reassembled in grid order.
    items: list[tuple[int | None, list[RouterPolicy]]] = [(None, [current])]
    for si, sh in enumerate(shards):
        for j in range(0, len(sh), 4):
            items.append((si, sh[j : j + 4]))
    total = len(points) + 1
    procs = processes if processes is not None else min(os.cpu_count() or 1, len(items))
    results: dict[int, list[Candidate]] = {}
    done = 0
    if procs <= 1:
        _init(state)
        for k, (si, pts) in enumerate(items):
            results[k] = _task(si, pts)
            done += len(pts)
            if progress:
                progress(done, total)
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=procs, mp_context=ctx, initializer=_init, initargs=(state,)) as ex:
            futs = {ex.submit(_task, si, pts): k for k, (si, pts) in enumerate(items)}
            for f in as_completed(futs):
                k = futs[f]
                results[k] = f.result()
                done += len(items[k][1])
                if progress:
                    progress(done, total)
    probe = results[0][0].model_copy(update={"shard": None})
    candidates = [c for k in range(1, len(items)) for c in results[k]]
    decision = decide(candidates, probe, obj, min_improvement_pct)
    return SweepResult(
        objective=obj.value,
        direction=DIRECTION[obj],
        units=UNITS[obj],
        workers=workers,
        seed=seed,
        shards=len(shards),
        grid_points=len(points),
        candidates=candidates,
        probe=probe,
        decision=decision,
    )
