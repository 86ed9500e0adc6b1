"""The KV router: Dynamo's ``DefaultWorkerSelector::worker_logit`` cost and its selection.

Cost per worker w, in blocks (lower is better; shared/research/dynamo.md section 3.1)::

    raw    = (prefill_tokens(w) + input_length) / block
    decay  = 1 / (1 + credit_decay * ((prefill_tokens(w) - min over w') / block) / request_blocks)
    adj    = max(raw - credit * decay * device_prefix(w) - tier credits, 0)
    cost   = prefill_load_scale * adj + active_blocks(w) + active_request_weight * active(w)

The load terms are the router's own bookkeeping of the requests it routed: prompt tokens
not yet prefilled (its estimate of the uncached part), prompt blocks of active requests,
active requests. The prefix terms are what the worker's KV events report.

Dynamo's further router options (``policy.RouterOptions``; all off by default): a router
queue that holds arrivals while every worker is busy, a prefill load that decays as the
oldest pending prompt progresses, KV events seen late, output blocks counted as they are
generated, and random tie-breaks from the seeded stream.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable

from powerfleet.sim.cache import BlockCache
from powerfleet.sim.policy import RouterOptions, RouterPolicy
from powerfleet.sim.request import Req


class Router:
    """Routes each request to a worker; keeps the per-worker load bookkeeping."""

    __slots__ = (
        "caches", "workers", "bt", "rng", "credit", "decay", "pls", "temp", "arw", "host_w", "disk_w",
        "shared_w", "tiers", "prefill", "blocks", "active", "opts", "random_ties", "views", "lag",
        "pending_events", "ais", "predict_ms", "pending", "since", "track_out", "out_heaps", "steps_at",
        "queue_limit", "held", "held_seq",
    )

    def __init__(
        self,
        policy: RouterPolicy,
        caches: list[BlockCache],
        block_tokens: int,
        seed: int,
        options: RouterOptions | None = None,
        *,
        max_batched_tokens: int = 8192,
        predict_prefill_ms: Callable[[float], float] | None = None,
        steps_at: Callable[[int, float], int] | None = None,
    ) -> None:
        opts = options or RouterOptions()
        self.opts = opts
        self.caches = caches
        self.workers = len(caches)
        self.bt = block_tokens
        self.rng = random.Random(seed)
        self.set_policy(policy)
        self.tiers = any(c.tiers is not None for c in caches)
        n = len(caches)
        self.prefill = [0] * n  # prompt tokens routed and not yet prefilled (router estimate)
        self.blocks = [0] * n  # prompt blocks of active requests
        self.active = [0] * n  # active requests
        self.random_ties = opts.router_tie_break == "random"
        # KV events seen late: the router matches prefixes against its own view of each
        # cache, fed from the caches' journals and applied once the lag has passed.
        self.lag = opts.kv_event_lag_ms
        self.views: list[dict[int, int]] | None = None
        self.pending_events: list[deque[tuple[float, int, int]]] = [deque() for _ in caches]
        if self.lag > 0:
            self.views = [{} for _ in caches]
            for c in caches:
                c.journal = []
        # prefill load model "ais": the oldest pending prompt of each worker decays
        self.ais = opts.router_prefill_load_model == "ais"
        self.predict_ms = predict_prefill_ms or (lambda n: 0.0)
        self.pending: list[deque[Req]] = [deque() for _ in caches]
        self.since = [0.0] * n
        # output blocks as they are generated
        self.track_out = opts.router_track_output_blocks
        self.out_heaps: list[list[tuple[int, int, Req]]] = [[] for _ in caches]
        self.steps_at = steps_at or (lambda wid, now: 0)
        # the router queue
        thr = opts.router_queue_threshold
        self.queue_limit = None if thr is None else thr * max_batched_tokens
        self.held: list[tuple[float, int, Req]] = []
        self.held_seq = 0

    def set_policy(self, policy: RouterPolicy) -> None:
        """The eight cost knobs (a sweep candidate takes over a warm-started router here)."""
        self.credit = policy.overlap_score_credit
        self.decay = policy.overlap_score_credit_decay
        self.pls = policy.prefill_load_scale
        self.temp = policy.temperature
        self.arw = policy.decode_active_request_weight
        self.host_w = policy.host_cache_hit_weight
        self.disk_w = policy.disk_cache_hit_weight
        self.shared_w = policy.shared_cache_multiplier

    # -- what the router sees ------------------------------------------------------------

    def observe(self, t: float) -> None:
        """Stamp cache changes made at ``t``; apply those whose lag has passed by ``t``."""
        if self.views is None:
            return
        lag = self.lag
        for wid, c in enumerate(self.caches):
            q = self.pending_events[wid]
            journal = c.journal
            if journal:
                vis = t + lag
                for op, h in journal:
                    q.append((vis, op, h))
                journal.clear()
            view = self.views[wid]
            while q and q[0][0] <= t:
                _, op, h = q.popleft()
                if op > 0:
                    view[h] = 1
                else:
                    view.pop(h, None)

    def loads(self, now: float) -> list[float] | list[int]:
        """Pending prefill tokens per worker; with ``ais`` the oldest decays over its
        predicted prefill time."""
        if not self.ais:
            return self.prefill
        out: list[float] = []
        for wid, p in enumerate(self.prefill):
            q = self.pending[wid]
            if q:
                head = q[0]
                dur = self.predict_ms(head.router_prefill)
                frac = (now - self.since[wid]) / dur if dur > 0 else 1.0
                if frac > 1.0:
                    frac = 1.0
                p = p - head.router_prefill * frac
            out.append(p)
        return out

    def _next_output_block(self, wid: int, r: Req) -> None:
        """Schedule the worker step after which ``r``'s sequence crosses into its next block.

        After worker step S (S >= decode_from) the request has produced g = 1 + S -
        decode_from tokens; its output blocks are ceil((isl + g) / block) - prompt blocks.
        """
        bt = self.bt
        g = (-(-r.isl // bt) + r.out_blocks) * bt - r.isl + 1
        if g <= r.osl:
            heapq.heappush(self.out_heaps[wid], (r.decode_from + g - 1, r.idx, r))

    def _count_output_blocks(self, now: float) -> None:
        for wid, heap in enumerate(self.out_heaps):
            if not heap:
                continue
            step = self.steps_at(wid, now)
            while heap and heap[0][0] <= step:
                r = heapq.heappop(heap)[2]
                if r.done:
                    continue
                r.out_blocks += 1
                self.blocks[wid] += 1
                self._next_output_block(wid, r)

    def costs(self, r: Req, now: float = 0.0) -> tuple[list[float], list[int]]:
        """Each worker's cost for ``r`` at ``now`` and the prefix the router counts there."""
        hs = r.hashes
        isl = r.isl
        bt = self.bt
        rblocks = r.nhash if r.nhash else 1
        credit = self.credit
        decay_knob = self.decay
        tiers = self.tiers
        pls = self.pls
        arw = self.arw
        prefill = self.loads(now)
        blocks = self.blocks
        active = self.active
        views = self.views
        costs: list[float] = []
        overlaps: list[int] = []
        min_pf = min(prefill) if decay_knob > 0 else 0
        for wid, c in enumerate(self.caches):
            cache = c.blocks if views is None else views[wid]
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
        """Temperature 0: the minimum; ties to the lowest index, or (``router_tie_break``
        random) a uniform pick among them from the seeded stream. Otherwise softmax over the
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
        elif self.random_ties and n > 1:
            ties = [i for i, c in enumerate(costs) if c == best_cost]
            if len(ties) > 1:
                best = ties[min(int(self.rng.random() * len(ties)), len(ties) - 1)]
        return best

    def route(self, r: Req, now: float = 0.0) -> int:
        """Pick a worker for ``r`` at ``now`` and book its load there."""
        if self.track_out:
            self._count_output_blocks(now)
        costs, overlaps = self.costs(r, now)
        wid = self.select(costs)
        o = overlaps[wid]
        if not (self.credit > 0 or self.tiers):  # the prefix was not needed for the cost
            c = self.caches[wid].blocks if self.views is None else self.views[wid]
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
        if self.ais:
            q = self.pending[wid]
            if not q:
                self.since[wid] = now
            q.append(r)
        return wid

    def prefill_done(self, wid: int, r: Req, now: float = 0.0, step: int = 0) -> None:
        """``r``'s first token came at ``now``, after the worker's step count ``step``."""
        self.prefill[wid] -= r.router_prefill
        if self.ais:
            q = self.pending[wid]
            if q and q[0] is r:
                q.popleft()
                self.since[wid] = now  # the next oldest starts to decay now
            elif r in q:
                q.remove(r)
        if self.track_out and r.osl > 1:
            r.decode_from = step
            self._next_output_block(wid, r)

    def complete(self, wid: int, r: Req) -> None:
        self.blocks[wid] -= r.router_blocks + r.out_blocks
        self.active[wid] -= 1
        r.done = True

    # -- the router queue ----------------------------------------------------------------

    def must_hold(self, now: float) -> bool:
        """Queueing is on and every worker's pending prefill exceeds the threshold."""
        lim = self.queue_limit
        if lim is None:
            return False
        return all(p > lim for p in self.loads(now))

    def hold(self, r: Req) -> None:
        self.held_seq += 1
        policy = self.opts.router_queue_policy
        if policy == "fcfs":
            key: float = r.arrival
        elif policy == "lcfs":
            key = -r.arrival
        else:  # wspt with equal weights: shortest prompt first
            key = float(r.isl)
        heapq.heappush(self.held, (key, self.held_seq if policy != "lcfs" else -self.held_seq, r))

    def release(self, now: float) -> Req | None:
        """The next held request, if some worker has room for it at ``now``."""
        if self.held and not self.must_hold(now):
            return heapq.heappop(self.held)[2]
        return None
