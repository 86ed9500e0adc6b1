"""Disaggregated replay: a prefill pool and a decode pool with the KV transfer between them.

Dynamo's disaggregated serving (its router docs, "Disaggregated Serving"; Dynamo 1.6.1's own
offline replay does the same): the frontend's prefill router picks a **prefill** worker with
the KV router's cost (prefix overlap and prefill load; active-block tracking off, since
prefill workers do not decode), the prefill worker computes the prompt, the frontend's decode
routing stage picks a **decode** worker by load (overlap credit 0, prefill tokens not
tracked), the prompt's KV moves over the link, and the decode worker produces every output
token. So:

* the retuned knobs (credit, prefill load scale, temperature, ...) act on the prefill
  router; the decode router keeps only the temperature and the active-request weight;
* transfer = prompt tokens x ``kv_bytes_per_token`` / ``kv_transfer_gb_s`` (the whole prompt,
  as the peer's default ``full_prompt`` mode; no setup latency);
* TTFT = router queue + prefill queue + prefill + transfer + decode queue + the first decode
  step; ITL and E2E come from the decode pool.

The prefill pool is the aggregated engine (``engine.Simulation``) fed with the same requests
cut to one output token: it finishes a request when its prompt is done, and its prompt
blocks stay in its prefix cache (entering it chunk by chunk, ``PrefillSteps``). Nothing on the decode side feeds back into the prefill pool
(no back-pressure), so the pools run one after the other over the same stop time, which keeps
``run(until)`` and ``fork(policy)`` (the sweep's warm start) exact.

Limits: the decode pool reserves each request's whole KV at admission (``kv_allocation:
incremental`` is refused) and has no offload tiers; a prefill worker frees a request's KV
when its prompt is done, where Dynamo's mocker holds it until the transfer ends.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from powerfleet.sim.batch import MIXED, StepModel, Worker
from powerfleet.sim.decode import DecodePool, decode_policy
from powerfleet.sim.engine import EngineConfig, EngineResult, Simulation
from powerfleet.sim.policy import SLA, RouterOptions, RouterPolicy
from powerfleet.sim.profile import CapCurve, TimingProfile, default_profile, validate_cap_fraction
from powerfleet.sim.replay import Arrivals, batch_masks, prepare
from powerfleet.sim.replay import replay_batches as replay_batches_agg
from powerfleet.sim.replay import warm_snapshot as warm_snapshot_agg
from powerfleet.sim.request import Req
from powerfleet.sim.router import Router
from powerfleet.sim.summary import ReplaySummary, Stats, summarize
from powerfleet.sim.trace import TraceRequest

# Inter-node InfiniBand between prefill and decode replicas, the P/D transfer bandwidth of
# Dynamo's mocker (shared/research/power_sim.md sections 3 and 6.4; NVLink would be ~600).
DEFAULT_KV_TRANSFER_GB_S = 64.0


@dataclass(frozen=True)
class Pools:
    """A disaggregated deployment: replica counts, engine profiles (None: the replay's
    ``profile``, else the built-in one) and the prefill -> decode link."""

    prefill_workers: int
    decode_workers: int
    prefill_profile: TimingProfile | None = None
    decode_profile: TimingProfile | None = None
    kv_transfer_gb_s: float = DEFAULT_KV_TRANSFER_GB_S
    # Each pool's GPU power cap / default TDP (None: the replay's ``cap_fraction``): the pools
    # carry their own power annotations, and prefill slows under a cap where decode barely does.
    prefill_cap_fraction: float | None = None
    decode_cap_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.prefill_workers < 1 or self.decode_workers < 1:
            raise ValueError(f"a disaggregated replay needs >= 1 prefill and >= 1 decode worker, "
                             f"got {self.prefill_workers} and {self.decode_workers}")
        if not (math.isfinite(self.kv_transfer_gb_s) and self.kv_transfer_gb_s > 0):
            raise ValueError(f"kv_transfer_gb_s must be a positive number, got {self.kv_transfer_gb_s}")

    @property
    def total(self) -> int:
        return self.prefill_workers + self.decode_workers

    def profiles(self, fallback: TimingProfile | None) -> tuple[TimingProfile, TimingProfile]:
        base = fallback or default_profile()
        return self.prefill_profile or base, self.decode_profile or base


def transfer_ms_per_token(kv_bytes_per_token: int, gb_s: float) -> float:
    """Milliseconds to move one token's KV: bytes / (GB/s x 1e9) x 1000."""
    return kv_bytes_per_token / (gb_s * 1e9) * 1000.0


class PrefillRouter(Router):
    """Dynamo's prefill router: the KV router's cost with active-block tracking off (prefill
    workers do not decode), so a worker's load is its pending prefill tokens (and, with a
    weight, its active requests)."""

    __slots__ = ()

    def route(self, r: Req, now: float = 0.0) -> int:
        wid = super().route(r, now)
        self.blocks[wid] -= r.router_blocks
        r.router_blocks = 0
        return wid


class PrefillSteps(StepModel):
    """The prefill workers' step model: a prompt's full blocks enter the prefix cache as its
    chunks are computed (vLLM caches each full block once computed, and Dynamo's mocker
    does), not only when the whole prompt is done; a request admitted behind a long prompt
    that shares its prefix reuses what is already computed. (The aggregated engine commits
    at the end of the prompt; its results are kept as they are.)"""

    __slots__ = ("committed",)

    @classmethod
    def wrap(cls, base: StepModel) -> PrefillSteps:
        self = cls.__new__(cls)
        for name in StepModel.__slots__:
            setattr(self, name, getattr(base, name))
        self.committed: dict[int, int] = {}  # request -> prompt blocks past its hits already committed
        return self

    def advance(self, w: Worker, t: float) -> None:
        chunk = w.chunk if w.kind == MIXED else []
        super().advance(w, t)
        bt = self.bt
        for r, _ in chunk:
            if r.left <= 0:
                continue  # done: prefill_done committed the rest
            full = min((r.length - r.left) // bt, r.nhash)
            start = r.hits + self.committed.get(r.idx, 0)
            if full > start:
                hits, n = r.hits, r.nhash
                r.hits, r.nhash = start, full  # commit_prompt moves blocks [hits, nhash)
                w.cache.commit_prompt(r)
                r.hits, r.nhash = hits, n
                self.committed[r.idx] = full - hits

    def prefill_done(self, w: Worker, r: Req, t: float) -> None:
        r.hits += self.committed.pop(r.idx, 0)  # only the blocks not yet committed move now
        super().prefill_done(w, r, t)


class PrefillPool(Simulation):
    """The aggregated engine as a prefill pool: every request ends with its prompt, and each
    end is a handoff (time, request) in the order the engine produced them."""

    def __init__(self, arrivals: list[float], isls: list[int], hashes: list[tuple[int, ...]], workers: int,
                 policy: RouterPolicy, profile: TimingProfile, engine: EngineConfig, router_seed: int,
                 router: RouterOptions | None = None, **speeds: Any) -> None:
        super().__init__(arrivals, isls, [1] * len(arrivals), hashes, workers, policy, profile, engine, router_seed,
                         router=router, **speeds)
        self.rt = PrefillRouter(
            policy, [w.cache for w in self.ws], engine.block_tokens, router_seed, router,
            max_batched_tokens=engine.max_num_batched_tokens, predict_prefill_ms=self.predict_prefill_ms,
            steps_at=self.steps_at,
        )
        self.model = PrefillSteps.wrap(self.model)
        self.handoffs: list[tuple[float, int]] = []

    def on_finish(self, w: Worker, r: Req, t: float) -> None:
        super().on_finish(w, r, t)
        self.handoffs.append((t, r.idx))

    def fork(self, policy: RouterPolicy) -> PrefillPool:
        other = super().fork(policy)
        assert isinstance(other, PrefillPool)
        other.handoffs = list(self.handoffs)
        return other


class DisaggSimulation:
    """Both pools of one replay; ``run(until)`` and ``fork(policy)`` as ``engine.Simulation``."""

    def __init__(self, arr: Arrivals, pools: Pools, policy: RouterPolicy, seed: int, *,
                 profile: TimingProfile | None = None, engine: EngineConfig | None = None,
                 cap_fraction: float = 1.0, cap_curve: CapCurve | None = None,
                 router: RouterOptions | None = None, max_run_steps: int | None = None) -> None:
        eng = engine or EngineConfig()
        if eng.kv_allocation != "reserve":
            raise ValueError("a disaggregated replay reserves KV at admission: kv_allocation 'incremental' "
                             "is not modelled for it")
        curve = cap_curve or CapCurve()
        validate_cap_fraction(cap_fraction, curve)
        pre_cap = cap_fraction if pools.prefill_cap_fraction is None else pools.prefill_cap_fraction
        dec_cap = cap_fraction if pools.decode_cap_fraction is None else pools.decode_cap_fraction
        validate_cap_fraction(pre_cap, curve)
        validate_cap_fraction(dec_cap, curve)
        pre, dec = pools.profiles(profile)
        kvb = pre.kv_bytes_per_token or dec.kv_bytes_per_token
        if kvb is None:
            raise ValueError(f"profiles {pre.name!r} and {dec.name!r} give no kv_bytes_per_token: the KV "
                             "transfer of a disaggregated replay needs it")
        self.pools, self.prefill_profile, self.decode_profile = pools, pre, dec
        self.policy = policy
        n = len(arr.arrival_ms)
        self.prefill = PrefillPool(
            arr.arrival_ms, arr.isl, arr.hashes, pools.prefill_workers, policy, pre, eng, seed * 2 + 1, router,
            prefill_speed=curve.prefill_throughput(pre_cap), decode_speed=curve.decode_throughput(pre_cap),
            max_run_steps=max_run_steps)
        self.decode = DecodePool(
            n, arr.isl, arr.osl, arr.hashes, pools.decode_workers, policy, dec, block_tokens=eng.block_tokens,
            max_num_seqs=eng.max_num_seqs, max_num_batched_tokens=eng.max_num_batched_tokens,
            router_seed=seed * 2 + 2, decode_speed=curve.decode_throughput(dec_cap),
            transfer_ms_per_token=transfer_ms_per_token(kvb, pools.kv_transfer_gb_s),
            max_run_steps=max_run_steps, router=router)

    def run(self, until: float | None = None) -> DisaggSimulation:
        self.prefill.run(until)
        self.decode.run(self.prefill.handoffs, until)
        return self

    def fork(self, policy: RouterPolicy) -> DisaggSimulation:
        """A copy whose routers continue with ``policy`` (the decode router with its load part)."""
        other = copy.copy(self)
        other.policy = policy
        other.prefill = self.prefill.fork(policy)
        d = self.decode
        od = copy.copy(d)
        memo: dict[int, Any] = {id(x): x for x in (d.isls, d.osls, d.hashes, d.profile)}
        memo[id(d)] = od  # the model's callbacks rebind to the copy
        for name in ("first", "finish", "where", "transfer_ms", "heap"):
            setattr(od, name, list(getattr(d, name)))
        od.dropped = dict(d.dropped)
        od.ws = copy.deepcopy(d.ws, memo)
        od.joins = copy.deepcopy(d.joins, memo)
        od.rt = copy.deepcopy(d.rt, memo)
        od.model = copy.deepcopy(d.model, memo)
        od.rt.set_policy(decode_policy(policy))
        other.decode = od
        return other

    def result(self) -> EngineResult:
        """Per-request outcomes: first token and finish from the decode pool, the routed worker
        and the prefix hits from the prefill pool (the router being tuned); nothing vanishes."""
        pre = self.prefill.result()
        dec = self.decode
        dropped = dict(pre.dropped)
        dropped.update(dec.dropped)
        for i in range(len(pre.arrival_ms)):
            if i not in dropped and math.isnan(dec.finish[i]):
                dropped[i] = "not_scheduled"
        return EngineResult(
            arrival_ms=pre.arrival_ms, first_token_ms=list(dec.first), finish_ms=list(dec.finish), worker=pre.worker,
            hit_blocks=pre.hit_blocks, prompt_blocks=pre.prompt_blocks, loaded_blocks=pre.loaded_blocks,
            dropped=dropped, routed_per_worker=pre.routed_per_worker, preemptions=pre.preemptions,
        )


class PoolsSummary(BaseModel):
    """The disaggregated part of a summary."""

    model_config = ConfigDict(frozen=True)
    prefill_workers: int
    decode_workers: int
    prefill_profile: str
    decode_profile: str
    kv_transfer_gb_s: float
    kv_transfer_ms: Stats
    requests_per_decode_worker: list[int]


class DisaggSummary(ReplaySummary):
    """``ReplaySummary`` (same contract, ``workers`` and ``gpus`` count both pools;
    ``requests_per_worker`` and ``load_imbalance`` are the prefill pool's, the routing being
    tuned) plus ``disaggregated``."""

    disaggregated: PoolsSummary


def summarize_disagg(sim: DisaggSimulation, res: EngineResult, arr: Arrivals, *, sla: SLA | None,
                     seed: int, cap_fraction: float, scored: tuple[bool, ...] | None) -> DisaggSummary:
    pools, pre, dec = sim.pools, sim.prefill_profile, sim.decode_profile
    base = summarize(res, arr.osl, workers=pools.prefill_workers, gpus_per_worker=pre.gpus_per_replica,
                     window_ms=arr.window_ms, sla=sla, policy=sim.policy, seed=seed,
                     profile=pre.name if pre.name == dec.name else f"{pre.name}+{dec.name}",
                     cap_fraction=cap_fraction, scored=scored)
    gpus = pools.prefill_workers * pre.gpus_per_replica + pools.decode_workers * dec.gpus_per_replica
    idx = [i for i in range(len(arr.osl)) if (scored is None or scored[i]) and not math.isnan(res.finish_ms[i])]
    per_decode = [0] * pools.decode_workers
    for i in range(len(arr.osl)):
        w = sim.decode.where[i]
        if w >= 0 and (scored is None or scored[i]):
            per_decode[w] += 1
    g = base.goodput_req_s
    extra = PoolsSummary(
        prefill_workers=pools.prefill_workers, decode_workers=pools.decode_workers, prefill_profile=pre.name,
        decode_profile=dec.name, kv_transfer_gb_s=pools.kv_transfer_gb_s,
        kv_transfer_ms=Stats.of([sim.decode.transfer_ms[i] for i in idx]), requests_per_decode_worker=per_decode)
    return DisaggSummary(**{
        **dict(base), "workers": pools.total, "gpus": gpus,
        "throughput_per_gpu_tok_s": round(base.throughput_tok_s / gpus, 6) if gpus else 0.0,
        "goodput_per_gpu_req_s": round(g / gpus, 6) if g is not None and gpus else None,
        "disaggregated": extra,
    })


# -- replay entry points: ``workers`` is a replica count (aggregated) or ``Pools`` --------------


def warm_snapshot(arr: Arrivals, workers: int | Pools, policy: RouterPolicy, seed: int = 0,
                  **options: Any) -> Simulation | DisaggSimulation | None:
    """``replay.warm_snapshot`` for either kind of deployment (options: profile, engine,
    cap_fraction, cap_curve, router)."""
    if not isinstance(workers, Pools):
        return warm_snapshot_agg(arr, workers, policy, seed, **options)
    if arr.scored is None:
        return None
    return DisaggSimulation(arr, workers, policy, seed, **options).run(until=0.0)


def replay_batches(arr: Arrivals, workers: int | Pools, policy: RouterPolicy | None = None, seed: int = 0, *,
                   batches: int = 0, sla: SLA | None = None, warm: Simulation | DisaggSimulation | None = None,
                   **options: Any) -> tuple[ReplaySummary, list[ReplaySummary]]:
    """``replay.replay_batches`` for either kind of deployment: the whole summary and one per
    batch of consecutive scored requests (the noise guard's pairs)."""
    if not isinstance(workers, Pools):
        assert warm is None or isinstance(warm, Simulation)
        return replay_batches_agg(arr, workers, policy, seed, batches=batches, sla=sla, warm=warm, **options)
    policy = policy or RouterPolicy()
    cap_fraction: float = options.get("cap_fraction", 1.0)
    if warm is not None:
        assert isinstance(warm, DisaggSimulation)
        sim = warm.fork(policy)
    else:
        sim = DisaggSimulation(arr, workers, policy, seed, **options)
    res = sim.run().result()

    def summary(mask: tuple[bool, ...] | None) -> ReplaySummary:
        return summarize_disagg(sim, res, arr, sla=sla, seed=seed, cap_fraction=cap_fraction, scored=mask)

    return summary(arr.scored), [summary(m) for m in batch_masks(arr, res.arrival_ms, batches)]


def replay(requests: Sequence[TraceRequest], pools: Pools, policy: RouterPolicy | None = None, seed: int = 0, *,
           sla: SLA | None = None, speedup: float = 1.0, window: tuple[float | None, float | None] | None = None,
           jitter_ms: float = 0.0, warmup_s: float | None = None, **options: Any) -> ReplaySummary:
    """``replay.replay`` of a disaggregated deployment (the same trace, window and warm-up rules)."""
    arr = prepare(requests, seed=seed, speedup=speedup, jitter_ms=jitter_ms, window=window, warmup_s=warmup_s)
    return replay_batches(arr, pools, policy, seed, sla=sla, **options)[0]
