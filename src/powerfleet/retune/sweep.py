"""Run a sweep locally: shards of grid points plus one probe, each a trace replay.

Every candidate and the probe replay the same prepared arrivals with the same seed
(common random numbers), so the probe's score equals ``sim replay`` with the same trace,
window, seed and settings, and scores compare fairly. This module only orchestrates; the
pure parts are ``grid.split_shards``, ``objectives.score`` and ``decision.decide``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Any

from powerfleet.retune.decision import Candidate, Decision, decide
from powerfleet.retune.guard import NoiseGuard
from powerfleet.retune.grid import EdgeSearch, SweepGrid, search_beyond, split_shards
from powerfleet.retune.objectives import DIRECTION, UNITS, Objective, parse_objective, score
from powerfleet.sim.disagg import DisaggSimulation, Pools, replay_batches, warm_snapshot
from powerfleet.sim.engine import EngineConfig, Simulation
from powerfleet.sim.policy import SLA, RouterOptions, RouterPolicy
from powerfleet.sim.profile import TimingProfile, load_profile
from powerfleet.sim.replay import Arrivals, prepare, warmup_span
from powerfleet.sim.summary import VersionedJson
from powerfleet.sim.trace import TraceRequest

SWEEP_SCHEMA = "powerfleet.retune.sweep/v1"
BATCHES = 16  # paired batches per candidate for the noise guard (retune.guard)


class SweepResult(VersionedJson):
    schema_: str = SWEEP_SCHEMA
    objective: str
    direction: str
    units: str
    workers: int
    seed: int
    shards: int
    grid_points: int
    search_points: int = 0  # candidates found beyond the grid's edge (``origin: "search"``)
    held_knobs: list[str] = []  # grid knobs held at the current setting: they cannot change this replay
    warmup_s: float = 0.0
    scored_from_s: float | None = None  # scored from a load change inside the window (retune sweep)
    shift: str | None = None  # that change (retune.shift)
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
            "requests": dec["requests"],
            "confidence": dec["confidence"],
            "runner_up_margin_pct": dec["runner_up_margin_pct"],
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
    workers: int | Pools,
    policy: RouterPolicy,
    seed: int,
    objective: Objective,
    sla: SLA | None = None,
    profile: TimingProfile | None = None,
    shard: int | None = None,
    engine: EngineConfig | None = None,
    router: RouterOptions | None = None,
    warm: Simulation | DisaggSimulation | None = None,
) -> Candidate:
    """Replay one setting and score it (a failed score is a candidate with ``ok`` false);
    ``warm``: the shared warm-up state to continue from (``replay.warm_snapshot``)."""
    summary, parts = replay_batches(arr, workers, policy, seed, batches=BATCHES, sla=sla, profile=profile,
                                    engine=engine, router=router, warm=warm)
    res = score(summary, objective, sla)
    batch = [score(p, objective, sla) for p in parts]
    return Candidate(params=policy.model_dump(), score=res.score, ok=res.ok, reason=res.reason, shard=shard,
                     requests=summary.requests, batches=[b.score if b.ok else None for b in batch] or None)


def run_shard(
    arr: Arrivals,
    workers: int | Pools,
    points: Sequence[RouterPolicy],
    seed: int,
    objective: Objective | str,
    sla: SLA | None = None,
    shard: int | None = None,
    profile: TimingProfile | None = None,
    engine: EngineConfig | None = None,
    router: RouterOptions | None = None,
    warm: Simulation | DisaggSimulation | None = None,
) -> list[Candidate]:
    """What one shard task does: replay and score its points in order."""
    obj = parse_objective(objective) if isinstance(objective, str) else objective
    return [evaluate(arr, workers, p, seed, obj, sla, profile, shard, engine, router, warm) for p in points]


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
    warmup_s: float | None = None,
    router: dict[str, Any] | None = None,
    warmup_policy: dict[str, Any] | None = None,
    profile: str | None = None,
    disagg: dict[str, Any] | None = None,
    cache_key: str | None = None,
) -> list[Candidate]:
    """JSON-in, models-out entry for a shard (or probe: one point) task.

    ``points`` are policy dicts (any subset of the eight parameters); the trace is read
    (non-strict) and cut exactly as ``run_sweep``/``sim replay`` do, so scores match.

    Warm start: with a ``window``, ``warmup_s`` seconds before it (None: one window length)
    are replayed unscored first. Without a ``window``, a ``warmup_s`` > 0 marks the file's
    first ``warmup_s`` seconds as the warm-up and scores the rest (for a window file cut
    with its warm-up span in front). ``warmup_policy``: the settings that served the
    warm-up span (the current ones; what ``run_sweep`` uses): it is replayed once under
    them and every point continues from a copy. Without it each point replays the
    warm-up under its own settings. ``router``: Dynamo's further router options (JSON).
    ``disagg`` (``fanin.DisaggSpec``'s fields): a disaggregated deployment, ``workers`` and
    ``profile`` its decode pool's (``sim.disagg.Pools``).
    ``cache_key``: the file's content hash (the live shard's ``window_sha256``); the prepared
    window and warm-up are then kept for this process's next shards of the same window.
    """
    from powerfleet.sim.engine import parse_engine
    from powerfleet.sim.policy import parse_policy, parse_router_options, parse_sla
    from powerfleet.sim.trace import read_trace

    pols = [parse_policy(p) for p in points]
    if window is None and warmup_s:
        window = (warmup_s, None)
    eng, opts = parse_engine(engine), parse_router_options(router)
    prof = load_profile(profile) if profile is not None else None
    pools: int | Pools = workers
    if disagg is not None:
        pre = disagg.get("prefill_profile")
        pools = Pools(disagg["prefill_replicas"], workers, prefill_profile=load_profile(pre) if pre else None,
                      decode_profile=prof, kv_transfer_gb_s=disagg["kv_transfer_gb_s"])

    def build() -> tuple[Arrivals, Simulation | None]:
        arr = prepare(read_trace(trace_path).requests, seed=seed, window=window, warmup_s=warmup_s)
        warm = None
        if warmup_policy is not None:
            warm = warm_snapshot(arr, pools, parse_policy(warmup_policy), seed, profile=prof, engine=eng, router=opts)
        return arr, warm

    if cache_key is None:
        arr, warm = build()
    else:
        stamps = []
        for path in (profile, (disagg or {}).get("prefill_profile")):
            if path is not None:  # a profile file edited in place must not meet a warm-up of the old one
                st = os.stat(path)
                stamps.append([st.st_mtime_ns, st.st_size])
        key = json.dumps([cache_key, workers, seed, window, warmup_s, engine, router, warmup_policy, profile, disagg,
                          stamps], sort_keys=True, default=str)
        arr, warm = _prepared(key, build)
    return run_shard(arr, pools, pols, seed, objective, parse_sla(sla), shard, prof, eng, opts, warm)


# The prepared window and its warm-up state, per process, for the shards that follow: a live
# sweep sends the probe, the grid shards and every search round as tasks of their own, and a
# sweep worker's process runs several of them on the same window. Each candidate forks the
# warm state (``Simulation.fork``) and never writes the arrivals, as ``run_sweep`` shares them
# between its candidates, so a hit replays exactly what a fresh read would.
_CACHE: OrderedDict[str, tuple[Arrivals, Simulation | None]] = OrderedDict()
_CACHE_MAX = 2


def forget_prepared() -> None:
    """Drop this process's prepared windows (as a fresh sweep process starts)."""
    _CACHE.clear()


def _prepared(key: str, build: Callable[[], tuple[Arrivals, Simulation | None]]) -> tuple[Arrivals, Simulation | None]:
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    got = build()
    _CACHE[key] = got
    while len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)
    return got


_STATE: dict[str, Any] = {}


def _init(state: dict[str, Any]) -> None:
    _STATE.clear()
    _STATE.update(state)


def _task(shard: int | None, points: list[RouterPolicy]) -> list[Candidate]:
    s = _STATE
    return run_shard(
        s["arr"], s["workers"], points, s["seed"], s["objective"], s["sla"], shard, s["profile"], s["engine"],
        s["router"], s["warm"],
    )


Items = list[tuple[int | None, list[RouterPolicy]]]


@contextmanager
def _runner(state: dict[str, Any], procs: int, progress: Callable[[int, int], None] | None,
            total: list[int]) -> Iterator[Callable[[Items], list[list[Candidate]]]]:
    """A function that replays work items (in a fork pool when ``procs`` > 1), results in order."""
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if progress:
            progress(done[0], total[0])

    if procs <= 1:
        _init(state)

        def run_serial(items: Items) -> list[list[Candidate]]:
            out = []
            for si, pts in items:
                out.append(_task(si, pts))
                tick(len(pts))
            return out

        yield run_serial
        return
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=procs, mp_context=ctx, initializer=_init, initargs=(state,)) as ex:

        def run_pool(items: Items) -> list[list[Candidate]]:
            return _gather(ex, items, tick)

        yield run_pool


def _gather(ex: Executor, items: Items, tick: Callable[[int], None]) -> list[list[Candidate]]:
    futs = {ex.submit(_task, si, pts): k for k, (si, pts) in enumerate(items)}
    results: dict[int, list[Candidate]] = {}
    for f in as_completed(futs):
        k = futs[f]
        results[k] = f.result()
        tick(len(items[k][1]))
    return [results[k] for k in range(len(items))]


def run_sweep(
    requests: Sequence[TraceRequest],
    workers: int | Pools,
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
    warmup_s: float | None = None,
    router: RouterOptions | None = None,
    search: EdgeSearch | None = None,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    guard: NoiseGuard | None = None,
) -> SweepResult:
    """Replay every grid point and the probe in a local process pool, search beyond the
    grid's edge (``search``, on by default) while ``budget_s`` wall seconds last, then decide.

    Every replay starts warm (``warmup_s``, default one window length before the window):
    the warm-up span is replayed once under ``current`` and each candidate continues from
    a copy of that state, with the same random streams (CRN).
    """
    t_start = clock()
    obj = parse_objective(objective) if isinstance(objective, str) else objective
    search = search if search is not None else EdgeSearch()
    disaggregated = isinstance(workers, Pools)
    held = grid.held_knobs(current, disaggregated=disaggregated, options=router)
    grid = grid.for_deployment(current, disaggregated=disaggregated, options=router)
    points = grid.points(current)
    shards = split_shards(points, max_shards)
    arr = prepare(requests, seed=seed, window=window, warmup_s=warmup_s)
    # The warm-up span was served by the current settings: replay it once, before the pool
    # forks, and let every candidate continue from a copy of that state.
    warm = warm_snapshot(arr, workers, current, seed, profile=profile, engine=engine, router=router)
    state = dict(arr=arr, workers=workers, seed=seed, objective=obj, sla=sla, profile=profile, engine=engine,
                 router=router, warm=warm)
    # Work items: the probe first, then each shard cut into small pieces so the pool stays
    # balanced and the progress bar moves; results are reassembled in grid order.
    items: Items = [(None, [current])]
    for si, sh in enumerate(shards):
        for j in range(0, len(sh), 4):
            items.append((si, sh[j : j + 4]))
    total = [len(points) + 1]
    procs = processes if processes is not None else min(os.cpu_count() or 1, len(items))
    with _runner(state, procs, progress, total) as run_items:
        results = run_items(items)
        probe = results[0][0].model_copy(update={"shard": None})
        candidates = [c for res in results[1:] for c in res]

        def score_points(new: list[RouterPolicy]) -> list[Candidate]:
            total[0] += len(new)
            return [c[0] for c in run_items([(None, [p]) for p in new])]

        found = search_beyond(
            grid.axes(current), candidates, obj, score_points, search,
            keep_going=lambda: budget_s is None or clock() - t_start < budget_s,
        )
    decision = decide(candidates + found, probe, obj, min_improvement_pct, guard=guard)
    return SweepResult(
        objective=obj.value,
        direction=DIRECTION[obj],
        units=UNITS[obj],
        workers=workers if isinstance(workers, int) else workers.total,
        seed=seed,
        shards=len(shards),
        grid_points=len(points),
        search_points=len(found),
        held_knobs=held,
        warmup_s=warmup_span(window, warmup_s),
        candidates=candidates + found,
        probe=probe,
        decision=decision,
    )

