"""The discrete-event loop: N worker replicas behind one KV router, simulated time only.

The parts live in their own modules and meet only here:

* ``router.Router``: Dynamo's cost and selection, and the router's load bookkeeping;
* ``batch.StepModel`` / ``batch.Worker``: one worker's continuous batching, step timing and
  event skipping (decode runs);
* ``cache.BlockCache`` / ``cache.OffloadTiers``: the device prefix cache with its KV
  reservation, and the optional host / disk / shared tiers.

One heap holds each worker's pending step end; arrivals are merged in time order. At an
arrival the router sees, per worker, the state the engine has at that instant: its prefix
cache (as KV events would report it) and its own bookkeeping of the requests it routed.
A request that could never fit in one worker is dropped; nothing else may vanish.
"""

from __future__ import annotations

import copy
import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from powerfleet.sim.batch import IDLE, StepModel, Worker, steps_done
from powerfleet.sim.cache import BlockCache, OffloadTiers
from powerfleet.sim.policy import RouterOptions, RouterPolicy, first_error, load_json_object
from powerfleet.sim.profile import TimingProfile
from powerfleet.sim.request import Req
from powerfleet.sim.router import Router

BLOCK_TOKENS = 512
DROP_KV = "exceeds_kv_capacity"


class EngineConfig(BaseModel):
    """Scheduler limits of one worker (Dynamo mocker ``MockEngineArgs`` defaults) and the
    optional offload tiers (off by default).

    Offload tiers hold copies of blocks the device evicted: ``host_cache_blocks`` (CPU memory)
    and ``disk_cache_blocks`` (local NVMe) per worker, ``shared_cache_blocks`` one pool for
    the whole cluster. A prompt block found there is loaded instead of recomputed, at
    ``*_load_ms_per_block`` (default: one 512-token block of Llama-3-70B KV, 160 MiB, over
    PCIe Gen5 to 4 GPUs ~0.84 ms; NVMe at ~28 GB/s ~6 ms; 64 GB/s network ~2.6 ms).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    block_tokens: int = Field(BLOCK_TOKENS, ge=1)
    # "reserve": the whole footprint at admission, never preempted (powerfleet's historical
    # model). "incremental": the prompt at admission, then one block per block_tokens
    # generated; when none is free the newest running request is preempted and later
    # recomputed (vLLM's and Dynamo's mocker's model).
    kv_allocation: Literal["reserve", "incremental"] = "reserve"
    host_cache_blocks: int = Field(0, ge=0)
    disk_cache_blocks: int = Field(0, ge=0)
    shared_cache_blocks: int = Field(0, ge=0)
    host_load_ms_per_block: float = Field(0.84, ge=0)
    disk_load_ms_per_block: float = Field(6.0, ge=0)
    shared_load_ms_per_block: float = Field(2.6, ge=0)


def parse_engine(text_or_obj: str | dict[str, Any] | None, what: str = "engine") -> EngineConfig:
    """Engine settings from JSON (any subset of the fields); errors name ``what`` and the field."""
    if text_or_obj is None:
        return EngineConfig()
    obj = load_json_object(text_or_obj, what) if isinstance(text_or_obj, str) else text_or_obj
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be a JSON object")
    try:
        return EngineConfig.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(f"{what} {first_error(exc)}") from None


@dataclass
class EngineResult:
    """Per-request outcome arrays (ms; NaN where not applicable) and per-worker counts."""

    arrival_ms: list[float]
    first_token_ms: list[float]
    finish_ms: list[float]
    worker: list[int]
    hit_blocks: list[int]
    prompt_blocks: list[int]
    loaded_blocks: list[int]
    dropped: dict[int, str]
    routed_per_worker: list[int]
    preemptions: int = 0


def build_caches(workers: int, capacity: int, engine: EngineConfig) -> list[BlockCache]:
    """One device cache per worker, with offload tiers when the engine sizes any."""
    shared: OrderedDict[int, None] = OrderedDict()
    tiered = engine.host_cache_blocks > 0 or engine.disk_cache_blocks > 0 or engine.shared_cache_blocks > 0
    caches = []
    for _ in range(workers):
        tiers = None
        if tiered:
            tiers = OffloadTiers(
                engine.host_cache_blocks, engine.disk_cache_blocks, shared, engine.shared_cache_blocks,
                engine.host_load_ms_per_block, engine.disk_load_ms_per_block, engine.shared_load_ms_per_block,
            )
        caches.append(BlockCache(capacity, engine.block_tokens, tiers))
    return caches


class Simulation:
    """The event loop and its state; ``run(until)`` may stop at a time and resume later, and
    ``fork(policy)`` continues a copy under other router settings (a shared warm start)."""

    def __init__(
        self,
        arrivals: list[float],
        isls: list[int],
        osls: list[int],
        hashes: list[tuple[int, ...]],
        workers: int,
        policy: RouterPolicy,
        profile: TimingProfile,
        engine: EngineConfig,
        router_seed: int,
        prefill_speed: float = 1.0,
        decode_speed: float = 1.0,
        max_run_steps: int | None = None,
        router: RouterOptions | None = None,
    ) -> None:
        n = len(arrivals)
        self.arrivals, self.isls, self.osls, self.hashes = arrivals, isls, osls, hashes
        bt = engine.block_tokens
        self.capacity = max(1, profile.kv_capacity_tokens // bt)
        caches = build_caches(workers, self.capacity, engine)
        self.ws = [Worker(i, c) for i, c in enumerate(caches)]
        self.profile = profile
        self.pf = 1.0 / prefill_speed
        self.rt = Router(
            policy, caches, bt, router_seed, router, max_batched_tokens=engine.max_num_batched_tokens,
            predict_prefill_ms=self.predict_prefill_ms, steps_at=self.steps_at,
        )
        self.first = [math.nan] * n
        self.finish = [math.nan] * n
        self.where = [-1] * n
        self.hit_blocks = [0] * n
        self.prompt_blocks = [0] * n
        self.loaded_blocks = [0] * n
        self.dropped: dict[int, str] = {}
        self.freed = False  # a prefill or request completed: the router queue may release
        self.model = StepModel(
            profile.prefill_ms, profile.decode_ms, prefill_speed, decode_speed, engine.max_num_batched_tokens,
            engine.max_num_seqs, bt, max_run_steps, self.on_first, self.on_finish,
            incremental=engine.kv_allocation == "incremental",
        )
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.i = 0  # next arrival

    def predict_prefill_ms(self, tokens: float) -> float:
        return self.profile.prefill_ms(tokens) * self.pf

    def steps_at(self, wid: int, now: float) -> int:
        return steps_done(self.ws[wid], now)

    def on_first(self, w: Worker, r: Req, t: float) -> None:
        if math.isnan(self.first[r.idx]):  # a preempted request's second prefill is not a first token
            self.first[r.idx] = t
            self.hit_blocks[r.idx] = r.dev_hits  # of its first admission
            self.loaded_blocks[r.idx] = r.loaded
            self.prompt_blocks[r.idx] = r.nhash
            self.rt.prefill_done(w.wid, r, t, w.steps)
            self.freed = True

    def on_finish(self, w: Worker, r: Req, t: float) -> None:
        self.finish[r.idx] = t
        self.rt.complete(w.wid, r)
        self.freed = True

    def place(self, r: Req, t: float) -> None:
        """Route ``r`` at ``t``; it joins its worker's next step."""
        wid = self.rt.route(r, t)
        w = self.ws[wid]
        self.where[r.idx] = wid
        w.routed += 1
        w.waiting.append(r)
        if w.kind == IDLE:
            started = self.model.start(w, t)
        else:
            started = self.model.cut(w, t)
        if started:
            self.seq += 1
            heapq.heappush(self.heap, (w.end, self.seq, wid, w.gen))

    def fork(self, policy: RouterPolicy) -> Simulation:
        """A copy of this simulation whose router continues with ``policy``."""
        other = copy.copy(self)  # the inputs are never written: shared, not copied
        memo: dict[int, Any] = {id(x): x for x in (self.arrivals, self.isls, self.osls, self.hashes, self.profile)}
        memo[id(self)] = other  # the callbacks bound to this simulation rebind to the copy
        for name in ("first", "finish", "where", "hit_blocks", "prompt_blocks", "loaded_blocks", "heap"):
            setattr(other, name, list(getattr(self, name)))
        other.dropped = dict(self.dropped)
        other.ws = copy.deepcopy(self.ws, memo)
        other.rt = copy.deepcopy(self.rt, memo)
        other.model = copy.deepcopy(self.model, memo)
        other.rt.set_policy(policy)
        return other

    def run(self, until: float | None = None) -> Simulation:
        """Process arrivals and step ends in time order, those before ``until`` (all if None)."""
        arrivals, heap, ws, model, rt = self.arrivals, self.heap, self.ws, self.model, self.rt
        n = len(arrivals)
        capacity = self.capacity
        stop = math.inf if until is None else until
        i = self.i
        while i < n or heap:
            if heap and (i >= n or heap[0][0] <= arrivals[i]):
                if heap[0][0] >= stop:
                    break
                t, _, wid, gen = heapq.heappop(heap)
                w = ws[wid]
                if gen != w.gen:
                    continue  # the run was cut by an arrival; a newer event replaced this one
                model.advance(w, t)
                if rt.held and self.freed:
                    # Held requests are released as prefills and requests complete (the router
                    # learns it on the response path), as Dynamo's replay router drains its
                    # queue; not at other step ends, which event skipping elides.
                    while (r := rt.release(t)) is not None:
                        self.place(r, t)
                self.freed = False
                if w.kind == IDLE and model.start(w, t):
                    self.seq += 1
                    heapq.heappush(heap, (w.end, self.seq, wid, w.gen))
                rt.observe(t)
                continue
            t = arrivals[i]
            if t >= stop:
                break
            r = Req(i, t, self.isls[i], self.osls[i], self.hashes[i])
            i += 1
            self.i = i
            if model.footprint(r) > capacity:
                self.dropped[r.idx] = DROP_KV
                continue
            rt.observe(t)
            if rt.must_hold(t):  # as Dynamo: an arrival queues only while every worker is busy
                rt.hold(r)
            else:
                self.place(r, t)
            rt.observe(t)
        self.i = i
        return self

    def result(self) -> EngineResult:
        """Per-request outcomes; anything still queued is reported (nothing may vanish)."""
        dropped = dict(self.dropped)
        finish = self.finish
        for w in self.ws:
            for r in list(w.waiting) + w.prefilling + [e[2] for e in w.decoding]:
                if math.isnan(finish[r.idx]):
                    dropped[r.idx] = "not_scheduled"
        for _, _, r in self.rt.held:
            dropped[r.idx] = "not_scheduled"
        return EngineResult(
            arrival_ms=list(self.arrivals),
            first_token_ms=list(self.first),
            finish_ms=list(finish),
            worker=list(self.where),
            hit_blocks=list(self.hit_blocks),
            prompt_blocks=list(self.prompt_blocks),
            loaded_blocks=list(self.loaded_blocks),
            dropped=dropped,
            routed_per_worker=[w.routed for w in self.ws],
            preemptions=sum(w.preempted for w in self.ws),
        )


def simulate(*args: Any, **kwargs: Any) -> EngineResult:
    """Replay requests (sorted by arrival, ms) over N replicas in one go; deterministic.

    Arguments are ``Simulation``'s: arrivals, input and output lengths, hash ids, workers,
    policy, profile, engine, router seed, then optionally the prefill / decode speeds,
    ``max_run_steps`` (caps the decode steps one event may cover; ``1`` is the naive
    step-by-step simulation the tests compare event skipping against) and ``router``
    (Dynamo's further router options, all off by default).
    """
    return Simulation(*args, **kwargs).run().result()
