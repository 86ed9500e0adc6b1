"""The discrete-event core: N worker replicas behind one KV router, simulated time only.

Per worker (vLLM-V1-like):

* a block-level prefix cache (512-token blocks, one per trace hash id) with reference
  counts and LRU eviction of unreferenced blocks; capacity in blocks from the profile;
* continuous batching limited by ``max_num_seqs`` and ``max_num_batched_tokens``; every
  running decode sequence takes one token of the budget, the rest goes to chunked prefill,
  FCFS, admitting waiting requests while the budget, the sequence limit and the KV
  capacity allow (head-of-line: a request that does not fit blocks the ones behind it);
* KV is reserved at admission for the whole request (prompt + output blocks), so nothing
  is ever preempted; a request that could never fit in one worker is dropped;
* step time = prefill_ms(new tokens) + decode_ms(batch, active KV), each divided by the
  power-cap throughput fraction of its phase.

Event skipping: while a worker runs decode only, its batch is constant until the next
sequence finishes, so the K steps up to that finish are one event. Step i of the run costs
``a + b i`` (``b`` = growth of the step time per step as KV grows by ``batch`` tokens; exact
for the default profile, whose decode time is linear in KV; a secant for table profiles),
so the run lasts ``K a + b K (K - 1) / 2``. An arrival routed to the worker mid-run cuts the
run at the first step boundary at or after the arrival (solving that quadratic).

The router sees, per worker, the state the engine has at the arrival instant: its prefix
cache (as KV events would report it) and its own bookkeeping of the requests it routed
(prefill tokens not yet prefilled, prompt blocks of active requests, active requests).
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from powerfleet.sim.policy import RouterPolicy, first_error
from powerfleet.sim.profile import TimingProfile

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
    host_cache_blocks: int = Field(0, ge=0)
    disk_cache_blocks: int = Field(0, ge=0)
    shared_cache_blocks: int = Field(0, ge=0)
    host_load_ms_per_block: float = Field(0.84, ge=0)
    disk_load_ms_per_block: float = Field(6.0, ge=0)
    shared_load_ms_per_block: float = Field(2.6, ge=0)


def parse_engine(text_or_obj: str | dict[str, Any] | None) -> EngineConfig:
    """Engine settings from JSON (any subset of the fields); errors name the field."""
    if text_or_obj is None:
        return EngineConfig()
    if isinstance(text_or_obj, str):
        try:
            obj = json.loads(text_or_obj)
        except json.JSONDecodeError as exc:
            raise ValueError(f"engine is not valid JSON: {exc.msg} at column {exc.colno}") from None
    else:
        obj = text_or_obj
    if not isinstance(obj, dict):
        raise ValueError("engine must be a JSON object")
    try:
        return EngineConfig.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(f"engine {first_error(exc)}") from None


class _Req:
    __slots__ = (
        "idx", "arrival", "isl", "osl", "hashes", "nhash", "hits", "left", "private",
        "router_prefill", "router_blocks", "finish_step", "onboard_ms",
    )

    def __init__(self, idx: int, arrival: float, isl: int, osl: int, hashes: tuple[int, ...]) -> None:
        self.idx = idx
        self.arrival = arrival
        self.isl = isl
        self.osl = osl
        self.hashes = hashes
        self.nhash = len(hashes)
        self.hits = 0
        self.left = 0
        self.private = 0
        self.router_prefill = 0
        self.router_blocks = 0
        self.finish_step = 0
        self.onboard_ms = 0.0


class _Worker:
    __slots__ = (
        "wid", "cache", "lru", "private", "capacity", "waiting", "prefilling", "decoding",
        "steps", "kv", "gen", "kind", "t0", "k", "a", "b", "end", "chunk",
        "r_prefill", "r_blocks", "r_active", "routed", "host", "disk",
    )

    def __init__(self, wid: int, capacity: int) -> None:
        self.wid = wid
        self.cache: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.private = 0
        self.capacity = capacity
        self.waiting: deque[_Req] = deque()
        self.prefilling: list[_Req] = []
        self.decoding: list[tuple[int, int, _Req]] = []  # heap of (finish_step, idx, req)
        self.steps = 0
        self.kv = 0
        self.gen = 0
        self.kind = 0  # 0 idle, 1 mixed/prefill step, 2 decode run
        self.t0 = 0.0
        self.k = 0
        self.a = 0.0
        self.b = 0.0
        self.end = 0.0
        self.chunk: list[tuple[_Req, int]] = []
        self.r_prefill = 0
        self.r_blocks = 0
        self.r_active = 0
        self.routed = 0
        self.host: OrderedDict[int, None] = OrderedDict()
        self.disk: OrderedDict[int, None] = OrderedDict()


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


def _lru_put(lru: OrderedDict[int, None], h: int, cap: int) -> int | None:
    """Insert or refresh ``h`` as most recent; return the block pushed out, if any."""
    lru[h] = None
    lru.move_to_end(h)
    if len(lru) > cap:
        return lru.popitem(last=False)[0]
    return None


def _run_steps(a: float, b: float, n: int) -> float:
    return n * a + b * n * (n - 1) * 0.5


def _steps_to_reach(a: float, b: float, x: float, kmax: int) -> int:
    """Smallest n in [0, kmax] with a*n + b*n(n-1)/2 >= x."""
    if x <= 0:
        return 0
    if abs(b) < 1e-15:
        n = math.ceil(x / a) if a > 0 else kmax
    else:
        h = a - 0.5 * b
        disc = h * h + 2.0 * b * x
        n = kmax if disc < 0 else math.ceil((-h + math.sqrt(disc)) / b - 1e-9)
    n = max(0, min(n, kmax))
    while n < kmax and _run_steps(a, b, n) < x:
        n += 1
    while n > 0 and _run_steps(a, b, n - 1) >= x:
        n -= 1
    return n


def simulate(
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
) -> EngineResult:
    """Replay requests (sorted by arrival, ms) over ``workers`` replicas; deterministic.

    ``max_run_steps`` caps how many decode steps one event may cover (``1`` = the naive
    step-by-step simulation the tests compare event skipping against).
    """
    n = len(arrivals)
    bt = engine.block_tokens
    capacity = max(1, profile.kv_capacity_tokens // bt)
    max_seqs = engine.max_num_seqs
    max_tokens = engine.max_num_batched_tokens
    prefill_ms = profile.prefill_ms
    decode_ms = profile.decode_ms
    pf = 1.0 / prefill_speed
    df = 1.0 / decode_speed

    credit = policy.overlap_score_credit
    decay_knob = policy.overlap_score_credit_decay
    pls = policy.prefill_load_scale
    temp = policy.temperature
    arw = policy.decode_active_request_weight
    rng = random.Random(router_seed)

    ws = [_Worker(i, capacity) for i in range(workers)]
    first = [math.nan] * n
    finish = [math.nan] * n
    where = [-1] * n
    hit_blocks = [0] * n
    prompt_blocks = [0] * n
    loaded_blocks = [0] * n
    host_cap = engine.host_cache_blocks
    disk_cap = engine.disk_cache_blocks
    shared_cap = engine.shared_cache_blocks
    tiers = host_cap > 0 or disk_cap > 0 or shared_cap > 0
    host_ms = engine.host_load_ms_per_block
    disk_ms = engine.disk_load_ms_per_block
    shared_ms = engine.shared_load_ms_per_block
    shared: OrderedDict[int, None] = OrderedDict()
    host_w = policy.host_cache_hit_weight
    disk_w = policy.disk_cache_hit_weight
    shared_w = policy.shared_cache_multiplier
    dropped: dict[int, str] = {}
    heap: list[tuple[float, int, int, int]] = []
    seq = 0

    def complete(w: _Worker, r: _Req, t: float) -> None:
        finish[r.idx] = t
        cache = w.cache
        lru = w.lru
        for h in r.hashes:
            rc = cache[h] - 1
            cache[h] = rc
            if rc == 0:
                lru[h] = None
        w.private -= r.private
        w.r_blocks -= r.router_blocks
        w.r_active -= 1

    def offload(w: _Worker, h: int) -> None:
        """A block left the device: keep a copy in the offload tiers (LRU each)."""
        if host_cap:
            spilled = _lru_put(w.host, h, host_cap)
            if spilled is not None and disk_cap:
                _lru_put(w.disk, spilled, disk_cap)
        elif disk_cap:
            _lru_put(w.disk, h, disk_cap)
        if shared_cap:
            _lru_put(shared, h, shared_cap)

    def tier_walk(w: _Worker, hs: tuple[int, ...]) -> tuple[int, int, int, int]:
        """Contiguous prefix found in device / host / disk / shared (first tier that has it)."""
        cache, host, disk = w.cache, w.host, w.disk
        dev = hst = dsk = shr = 0
        for h in hs:
            if h in cache:
                dev += 1
            elif h in host:
                hst += 1
            elif h in disk:
                dsk += 1
            elif h in shared:
                shr += 1
            else:
                break
        return dev, hst, dsk, shr

    def admit(w: _Worker, r: _Req) -> bool:
        cache = w.cache
        hs = r.hashes
        hits = 0
        dev_hits = 0
        free_hits = 0
        onboard = 0.0
        if tiers:
            host, disk = w.host, w.disk
            for h in hs:
                rc = cache.get(h)
                if rc is not None:
                    dev_hits += 1
                    if rc == 0:
                        free_hits += 1
                elif h in host:
                    onboard += host_ms
                elif h in disk:
                    onboard += disk_ms
                elif h in shared:
                    onboard += shared_ms
                else:
                    break
                hits += 1
        else:
            for h in hs:
                rc = cache.get(h)
                if rc is None:
                    break
                hits += 1
                if rc == 0:
                    free_hits += 1
            dev_hits = hits
        total_blocks = -(-(r.isl + r.osl) // bt)
        if total_blocks < r.nhash:
            total_blocks = r.nhash
        need = total_blocks - dev_hits
        lru = w.lru
        pinned = len(cache) - len(lru) + w.private
        if pinned + free_hits + need > w.capacity:
            return False
        loaded = []
        for i in range(hits):
            h = hs[i]
            rc = cache.get(h)
            if rc is None:
                loaded.append(h)
                continue
            if rc == 0:
                del lru[h]
            cache[h] = rc + 1
        over = len(cache) + w.private + need - w.capacity
        while over > 0:
            h, _ = lru.popitem(last=False)
            del cache[h]
            if tiers:
                offload(w, h)
            over -= 1
        for h in loaded:  # loaded blocks enter the device cache at once, pinned
            cache[h] = cache.get(h, 0) + 1
        private = need - len(loaded)
        w.private += private
        r.private = private
        r.hits = hits
        r.onboard_ms = onboard
        hit_blocks[r.idx] = dev_hits
        loaded_blocks[r.idx] = len(loaded)
        prompt_blocks[r.idx] = r.nhash
        new = r.isl - hits * bt
        r.left = new if new > 1 else 1
        return True

    def prefill_done(w: _Worker, r: _Req, t: float) -> None:
        first[r.idx] = t
        cache = w.cache
        lru = w.lru
        hs = r.hashes
        moved = 0
        for i in range(r.hits, r.nhash):
            h = hs[i]
            rc = cache.get(h)
            if rc is None:
                cache[h] = 1
            else:
                if rc == 0:
                    del lru[h]
                cache[h] = rc + 1
            moved += 1
        # blocks moved from the private reservation into the shared cache
        w.private -= moved
        r.private -= moved
        w.r_prefill -= r.router_prefill
        if r.osl <= 1:
            complete(w, r, t)
        else:
            r.finish_step = w.steps + r.osl - 1
            heapq.heappush(w.decoding, (r.finish_step, r.idx, r))
            w.kv += r.isl + 1

    def finish_due(w: _Worker, t: float) -> None:
        dec = w.decoding
        steps = w.steps
        while dec and dec[0][0] <= steps:
            r = heapq.heappop(dec)[2]
            w.kv -= r.isl + r.osl
            complete(w, r, t)

    def start(w: _Worker, t: float) -> None:
        nonlocal seq
        nd = len(w.decoding)
        budget = max_tokens - nd
        chunk: list[tuple[_Req, int]] = []
        ptoks = 0
        onboard = 0.0
        if budget > 0:
            for r in w.prefilling:
                take = r.left if r.left < budget else budget
                chunk.append((r, take))
                ptoks += take
                budget -= take
                if budget <= 0:
                    break
            waiting = w.waiting
            while budget > 0 and waiting and nd + len(w.prefilling) < max_seqs:
                r = waiting[0]
                if not admit(w, r):
                    break
                waiting.popleft()
                w.prefilling.append(r)
                onboard += r.onboard_ms
                take = r.left if r.left < budget else budget
                chunk.append((r, take))
                ptoks += take
                budget -= take
        w.gen += 1
        if ptoks > 0:
            dt = prefill_ms(ptoks) * pf + onboard
            if nd:
                dt += decode_ms(nd, w.kv) * df
            w.kind = 1
            w.chunk = chunk
            w.end = t + dt
        elif nd:
            k = w.decoding[0][0] - w.steps
            if max_run_steps is not None and k > max_run_steps:
                k = max_run_steps
            kv = w.kv
            a = decode_ms(nd, kv) * df
            b = decode_ms(nd, kv + nd) * df - a
            w.kind = 2
            w.t0 = t
            w.k = k
            w.a = a
            w.b = b
            w.end = t + _run_steps(a, b, k)
        else:
            w.kind = 0
            return
        seq += 1
        heapq.heappush(heap, (w.end, seq, w.wid, w.gen))

    def advance(w: _Worker, t: float) -> None:
        """The worker's pending step/run ended at ``t``: apply it."""
        nd = len(w.decoding)
        if w.kind == 1:
            w.steps += 1
            w.kv += nd
            done = []
            for r, take in w.chunk:
                r.left -= take
                if r.left <= 0:
                    done.append(r)
            w.chunk = []
            if done:
                w.prefilling = [r for r in w.prefilling if r.left > 0]
            finish_due(w, t)
            for r in done:
                prefill_done(w, r, t)
        elif w.kind == 2:
            w.steps += w.k
            w.kv += nd * w.k
            finish_due(w, t)
        w.kind = 0

    def route(r: _Req) -> _Worker:
        hs = r.hashes
        isl = r.isl
        rblocks = r.nhash if r.nhash else 1
        best = None
        best_cost = math.inf
        costs = []
        overlaps = []
        if decay_knob > 0:
            min_pf = min(w.r_prefill for w in ws)
        for w in ws:
            cache = w.cache
            o = 0
            extra = 0.0
            if tiers:
                o, hst, dsk, shr = tier_walk(w, hs)
                extra = host_w * hst + disk_w * dsk + shared_w * shr
                o_route = o + hst + dsk + shr
            elif credit > 0:
                for h in hs:
                    if h in cache:
                        o += 1
                    else:
                        break
                o_route = o
            else:
                o_route = 0
            overlaps.append(o_route)
            raw = (w.r_prefill + isl) / bt
            if o or extra:
                if decay_knob > 0 and o:
                    d = 1.0 / (1.0 + decay_knob * ((w.r_prefill - min_pf) / bt) / rblocks)
                else:
                    d = 1.0
                adj = raw - credit * d * o - extra
                if adj < 0:
                    adj = 0.0
            else:
                adj = raw
            cost = pls * adj + w.r_blocks + arw * w.r_active
            costs.append(cost)
            if cost < best_cost:
                best_cost = cost
                best = w
        if temp > 0 and workers > 1:
            lo = best_cost
            hi = max(costs)
            if hi > lo:
                scale = -1.0 / ((hi - lo) * temp)
                weights = [math.exp((c - lo) * scale) for c in costs]
                x = rng.random() * sum(weights)
                acc = 0.0
                pick = workers - 1
                for i, wt in enumerate(weights):
                    acc += wt
                    if x < acc:
                        pick = i
                        break
            else:
                pick = int(rng.random() * workers)
                if pick >= workers:
                    pick = workers - 1
            best = ws[pick]
        assert best is not None
        o = overlaps[best.wid]
        if not (credit > 0 or tiers):
            c = best.cache
            for h in hs:
                if h in c:
                    o += 1
                else:
                    break
        est = isl - o * bt
        r.router_prefill = est if est > 0 else 0
        r.router_blocks = rblocks
        return best

    i = 0
    while i < n or heap:
        if heap and (i >= n or heap[0][0] <= arrivals[i]):
            t, _, wid, gen = heapq.heappop(heap)
            w = ws[wid]
            if gen != w.gen:
                continue
            advance(w, t)
            start(w, t)
            continue
        t = arrivals[i]
        hs = hashes[i]
        r = _Req(i, t, isls[i], osls[i], hs)
        i += 1
        need = max(-(-(r.isl + r.osl) // bt), r.nhash)
        if need > capacity:
            dropped[r.idx] = DROP_KV
            continue
        w = route(r)
        where[r.idx] = w.wid
        w.routed += 1
        w.r_prefill += r.router_prefill
        w.r_blocks += r.router_blocks
        w.r_active += 1
        w.waiting.append(r)
        if w.kind == 0:
            start(w, t)
        elif w.kind == 2 and t < w.end:
            k = _steps_to_reach(w.a, w.b, t - w.t0, w.k)
            if k < w.k:
                w.k = k
                w.end = w.t0 + _run_steps(w.a, w.b, k)
                w.gen += 1
                seq += 1
                heapq.heappush(heap, (w.end, seq, w.wid, w.gen))

    for w in ws:  # nothing may vanish: anything still queued is reported
        for r in list(w.waiting) + w.prefilling + [e[2] for e in w.decoding]:
            if math.isnan(finish[r.idx]):
                dropped[r.idx] = "not_scheduled"

    return EngineResult(
        arrival_ms=list(arrivals),
        first_token_ms=first,
        finish_ms=finish,
        worker=where,
        hit_blocks=hit_blocks,
        prompt_blocks=prompt_blocks,
        loaded_blocks=loaded_blocks,
        dropped=dropped,
        routed_per_worker=[w.routed for w in ws],
    )
