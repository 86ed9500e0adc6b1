"""The decode pool of a disaggregated deployment: decode-only workers behind a load router.

A request reaches a decode worker with its prompt's KV already computed (by a prefill
worker) and transferred. It joins the worker's next decode step: no prompt token is
computed here, and every output token is one decode step, the first included (so the first
token comes one decode step after the request joins; Dynamo's mocker does the same).

The pieces are the aggregated engine's:

* ``batch.StepModel`` forms and applies the decode runs (event skipping, cuts at arrivals);
  ``DecodeModel`` only changes admission: waiting requests go straight into the decode batch,
  and the first token of a request is stamped at the end of the first step it takes part in;
* ``cache.BlockCache`` holds each worker's KV, reserved in full at admission (the transferred
  prompt enters the worker's prefix cache, the output is private);
* ``router.Router`` picks the decode worker. Dynamo's decode routing stage in disaggregated
  mode turns overlap scoring and prefill-token tracking off (credit 0, ``track_prefill_tokens
  = false``), so the cost is the active blocks plus ``decode_active_request_weight`` x the
  active requests: routing by load (``decode_policy``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

from powerfleet.sim.batch import DECODE_RUN, IDLE, StepModel, Worker, steps_done
from powerfleet.sim.cache import BlockCache
from powerfleet.sim.policy import RouterOptions, RouterPolicy
from powerfleet.sim.profile import TimingProfile
from powerfleet.sim.request import Req
from powerfleet.sim.router import Router

_NOTHING: deque[Req] = deque()  # the waiting queue the base model sees: nothing to prefill here


def decode_policy(policy: RouterPolicy) -> RouterPolicy:
    """The decode router's settings: no prefix credit, no prefill load (Dynamo's decode stage),
    the same temperature and active-request weight."""
    return RouterPolicy(overlap_score_credit=0.0, prefill_load_scale=0.0, temperature=policy.temperature,
                        decode_active_request_weight=policy.decode_active_request_weight)


class DecodeModel(StepModel):
    """``StepModel`` for decode-only workers (the KV of a prompt arrives by transfer)."""

    __slots__ = ("awaiting",)

    def __init__(self, decode_ms: Any, decode_speed: float, max_tokens: int, max_seqs: int, block_tokens: int,
                 max_run_steps: int | None, on_first: Any, on_finish: Any, workers: int) -> None:
        super().__init__(lambda n: 0.0, decode_ms, 1.0, decode_speed, max_tokens, max_seqs, block_tokens,
                         max_run_steps, on_first, on_finish)
        self.awaiting: list[list[Req]] = [[] for _ in range(workers)]  # joined, first token not yet out

    def join(self, w: Worker) -> None:
        """Admit waiting requests into the decode batch while sequences and KV allow (head of line)."""
        waiting = w.waiting
        while waiting and len(w.decoding) < self.max_seqs:
            r = waiting[0]
            r.length = r.isl
            if not w.cache.reserve(r, self.footprint(r)):
                break
            waiting.popleft()
            w.cache.commit_prompt(r)  # the transferred prompt is this worker's cached prefix now
            w.admitted += 1
            r.admits = 1
            r.seq = w.admitted
            r.left = 0
            r.decode_from = w.steps
            r.finish_step = w.steps + r.osl  # every output token is a decode step here
            heapq.heappush(w.decoding, (r.finish_step, r.idx, r))
            w.kv += r.isl
            self.awaiting[w.wid].append(r)

    def start(self, w: Worker, t: float) -> bool:
        self.join(w)
        queued = w.waiting
        w.waiting = _NOTHING  # what still waits needs KV, not a prefill chunk
        try:
            started = super().start(w, t)
        finally:
            w.waiting = queued
        if started and self.awaiting[w.wid] and w.k > 1:
            # A run whose first step brings someone's first token ends there: the first token
            # and the router's bookkeeping of it (output blocks) happen when they happen.
            w.k = 1
            w.end = w.t0 + w.a
        return started

    def advance(self, w: Worker, t: float) -> None:
        # The run's first step ends at t0 + a: the first token of every request that joined it.
        if w.kind == DECODE_RUN and w.k > 0 and self.awaiting[w.wid]:
            first = w.t0 + w.a
            for r in self.awaiting[w.wid]:
                self.on_first(w, r, first)
            self.awaiting[w.wid] = []
        super().advance(w, t)


class DecodePool:
    """The decode workers and their router; fed with handoffs (prefill done, at time t)."""

    def __init__(self, n: int, isls: list[int], osls: list[int], hashes: list[tuple[int, ...]], workers: int,
                 policy: RouterPolicy, profile: TimingProfile, *, block_tokens: int, max_num_seqs: int,
                 max_num_batched_tokens: int, router_seed: int, decode_speed: float, transfer_ms_per_token: float,
                 max_run_steps: int | None = None, router: RouterOptions | None = None) -> None:
        self.isls, self.osls, self.hashes = isls, osls, hashes
        self.capacity = max(1, profile.kv_capacity_tokens // block_tokens)
        self.ws = [Worker(i, BlockCache(self.capacity, block_tokens)) for i in range(workers)]
        self.profile = profile
        self.transfer_ms_per_token = transfer_ms_per_token
        opts = router or RouterOptions()
        # Only what applies to load routing carries over: ties, output blocks.
        self.rt = Router(decode_policy(policy), [w.cache for w in self.ws], block_tokens, router_seed,
                         RouterOptions(router_tie_break=opts.router_tie_break,
                                       router_track_output_blocks=opts.router_track_output_blocks),
                         max_batched_tokens=max_num_batched_tokens, steps_at=self.steps_at)
        self.model = DecodeModel(profile.decode_ms, decode_speed, max_num_batched_tokens, max_num_seqs,
                                 block_tokens, max_run_steps, self.on_first, self.on_finish, workers)
        self.first = [math.nan] * n
        self.finish = [math.nan] * n
        self.where = [-1] * n
        self.transfer_ms = [math.nan] * n
        self.dropped: dict[int, str] = {}
        self.heap: list[tuple[float, int, int, int]] = []  # step ends: (t, seq, worker, gen)
        self.joins: list[tuple[float, int, int, Req]] = []  # transfers landing: (t, seq, worker, request)
        self.seq = 0
        self.fed = 0  # handoffs taken so far

    def steps_at(self, wid: int, now: float) -> int:
        return steps_done(self.ws[wid], now)

    def on_first(self, w: Worker, r: Req, t: float) -> None:
        self.first[r.idx] = t
        self.rt.prefill_done(w.wid, r, t, r.decode_from + 1)

    def on_finish(self, w: Worker, r: Req, t: float) -> None:
        self.finish[r.idx] = t
        self.rt.complete(w.wid, r)

    def handoff(self, idx: int, t: float) -> None:
        """Request ``idx``'s prefill ended at ``t``: pick its decode worker now (the router books
        it at once) and start the KV transfer; it joins the worker when the transfer ends."""
        osl = self.osls[idx] if self.osls[idx] > 0 else 1  # the first token is a decode step here
        r = Req(idx, t, self.isls[idx], osl, self.hashes[idx])
        if self.model.footprint(r) > self.capacity:
            self.dropped[idx] = "exceeds_kv_capacity"
            return
        wid = self.rt.route(r, t)
        self.where[idx] = wid
        self.ws[wid].routed += 1
        x = r.isl * self.transfer_ms_per_token
        self.transfer_ms[idx] = x
        self.seq += 1
        heapq.heappush(self.joins, (t + x, self.seq, wid, r))

    def _push(self, w: Worker) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (w.end, self.seq, w.wid, w.gen))

    def run(self, handoffs: list[tuple[float, int]], until: float | None = None) -> None:
        """Process step ends, handoffs and landed transfers in time order, those before ``until``.
        At one instant: step ends first, then handoffs, then transfers landing."""
        heap, joins, ws, model = self.heap, self.joins, self.ws, self.model
        stop = math.inf if until is None else until
        inf = math.inf
        while True:
            ts = heap[0][0] if heap else inf
            th = handoffs[self.fed][0] if self.fed < len(handoffs) else inf
            tj = joins[0][0] if joins else inf
            t = min(ts, th, tj)
            if t == inf or t >= stop:
                return
            if ts == t:
                _, _, wid, gen = heapq.heappop(heap)
                w = ws[wid]
                if gen != w.gen:
                    continue  # the run was cut; a newer event replaced this one
                model.advance(w, t)
                if w.kind == IDLE and model.start(w, t):
                    self._push(w)
            elif th == t:
                idx = handoffs[self.fed][1]
                self.fed += 1
                self.handoff(idx, t)
            else:
                _, _, wid, r = heapq.heappop(joins)
                w = ws[wid]
                w.waiting.append(r)
                if model.start(w, t) if w.kind == IDLE else model.cut(w, t):
                    self._push(w)

    def unfinished(self) -> list[int]:
        """Requests handed off that have not finished (nothing may vanish)."""
        return [i for i in range(len(self.finish)) if self.where[i] >= 0 and math.isnan(self.finish[i])]
