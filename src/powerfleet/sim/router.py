"""The KV router: Dynamo's ``DefaultWorkerSelector::worker_logit`` cost and its selection.

Cost per worker w, in blocks (lower is better; shared/research/dynamo.md section 3.1)::

    raw    = (prefill_tokens(w) + input_length) / block
    decay  = 1 / (1 + credit_decay * ((prefill_tokens(w) - min over w') / block) / request_blocks)
    adj    = max(raw - credit * decay * device_prefix(w) - tier credits, 0)
    cost   = prefill_load_scale * adj + active_blocks(w) + active_request_weight * active(w)

The load terms are the router's own bookkeeping of the requests it routed: prompt tokens
not yet prefilled (its estimate of the uncached part), prompt blocks of active requests,
active requests. The prefix terms are what the worker's KV events report.
"""

from __future__ import annotations

import math
import random

from powerfleet.sim.cache import BlockCache
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.request import Req


class Router:
    """Routes each request to a worker; keeps the per-worker load bookkeeping."""

    __slots__ = (
        "caches", "workers", "bt", "rng", "credit", "decay", "pls", "temp", "arw", "host_w", "disk_w",
        "shared_w", "tiers", "prefill", "blocks", "active",
    )

    def __init__(self, policy: RouterPolicy, caches: list[BlockCache], block_tokens: int, seed: int) -> None:
        self.caches = caches
        self.workers = len(caches)
        self.bt = block_tokens
        self.rng = random.Random(seed)
        self.credit = policy.overlap_score_credit
        self.decay = policy.overlap_score_credit_decay
        self.pls = policy.prefill_load_scale
        self.temp = policy.temperature
        self.arw = policy.decode_active_request_weight
        self.host_w = policy.host_cache_hit_weight
        self.disk_w = policy.disk_cache_hit_weight
        self.shared_w = policy.shared_cache_multiplier
        self.tiers = any(c.tiers is not None for c in caches)
        n = len(caches)
        self.prefill = [0] * n  # prompt tokens routed and not yet prefilled (router estimate)
        self.blocks = [0] * n  # prompt blocks of active requests
        self.active = [0] * n  # active requests

    def costs(self, r: Req) -> tuple[list[float], list[int]]:
        """Each worker's cost for ``r`` and the prefix the router counts there."""
        hs = r.hashes
        isl = r.isl
        bt = self.bt
        rblocks = r.nhash if r.nhash else 1
        credit = self.credit
        decay_knob = self.decay
        tiers = self.tiers
        pls = self.pls
        arw = self.arw
        prefill = self.prefill
        blocks = self.blocks
        active = self.active
        costs: list[float] = []
        overlaps: list[int] = []
        min_pf = min(prefill) if decay_knob > 0 else 0
        for wid, c in enumerate(self.caches):
            cache = c.blocks
            o = 0
            extra = 0.0
            if tiers:
                o, hst, dsk, shr = c.tiers.walk(cache, hs)  # type: ignore[union-attr]
                extra = self.host_w * hst + self.disk_w * dsk + self.shared_w * shr
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
            rp = prefill[wid]
            raw = (rp + isl) / bt
            if o or extra:
                if decay_knob > 0 and o:
                    d = 1.0 / (1.0 + decay_knob * ((rp - min_pf) / bt) / rblocks)
                else:
                    d = 1.0
                adj = raw - credit * d * o - extra
                if adj < 0:
                    adj = 0.0
            else:
                adj = raw
            costs.append(pls * adj + blocks[wid] + arw * active[wid])
        return costs, overlaps

    def select(self, costs: list[float]) -> int:
        """Temperature 0: the minimum (ties to the lowest index). Otherwise softmax over the
        costs normalised to [-1/T, 0], sampled with one draw from the seeded stream."""
        best = 0
        best_cost = math.inf
        for i, cost in enumerate(costs):
            if cost < best_cost:
                best_cost = cost
                best = i
        n = self.workers
        if self.temp > 0 and n > 1:
            hi = max(costs)
            if hi > best_cost:
                scale = -1.0 / ((hi - best_cost) * self.temp)
                weights = [math.exp((c - best_cost) * scale) for c in costs]
                x = self.rng.random() * sum(weights)
                acc = 0.0
                best = n - 1
                for i, wt in enumerate(weights):
                    acc += wt
                    if x < acc:
                        best = i
                        break
            else:
                best = int(self.rng.random() * n)
                if best >= n:
                    best = n - 1
        return best

    def route(self, r: Req) -> int:
        """Pick a worker for ``r`` and book its load there."""
        costs, overlaps = self.costs(r)
        wid = self.select(costs)
        o = overlaps[wid]
        if not (self.credit > 0 or self.tiers):  # the prefix was not needed for the cost
            c = self.caches[wid].blocks
            for h in r.hashes:
                if h in c:
                    o += 1
                else:
                    break
        est = r.isl - o * self.bt
        r.router_prefill = est if est > 0 else 0
        r.router_blocks = r.nhash if r.nhash else 1
        self.prefill[wid] += r.router_prefill
        self.blocks[wid] += r.router_blocks
        self.active[wid] += 1
        return wid

    def prefill_done(self, wid: int, r: Req) -> None:
        self.prefill[wid] -= r.router_prefill

    def complete(self, wid: int, r: Req) -> None:
        self.blocks[wid] -= r.router_blocks
        self.active[wid] -= 1
