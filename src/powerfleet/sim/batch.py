"""One worker's continuous batching and step timing (vLLM-V1-like), in simulated time.

* Each step, every running decode sequence takes one token of ``max_num_batched_tokens``;
  the rest goes to chunked prefill, FCFS: requests already prefilling first, then waiting
  requests admitted while the budget, ``max_num_seqs`` and the KV cache allow
  (head-of-line: one that does not fit blocks those behind it).
* Step time = prefill_ms(new tokens) + decode_ms(batch, active KV), each divided by the
  power-cap throughput fraction of its phase, plus the load time of blocks onboarded from
  an offload tier.
* Event skipping: while a worker only decodes, its batch is constant until the next
  sequence finishes, so the K steps up to that finish are one event. Step i costs
  ``a + b i`` (``b``: growth of the step as KV grows by ``batch`` tokens per step; exact
  when decode time is linear in KV, a secant otherwise), so the run lasts
  ``K a + b K (K - 1) / 2``. An arrival mid-run cuts it at the first step boundary at or
  after the arrival (``steps_to_reach`` solves the quadratic).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

from powerfleet.sim.cache import BlockCache
from powerfleet.sim.request import Req

IDLE, MIXED, DECODE_RUN = 0, 1, 2


def run_ms(a: float, b: float, n: int) -> float:
    """Duration of ``n`` decode steps whose i-th step costs ``a + b i``."""
    return n * a + b * n * (n - 1) * 0.5


def steps_to_reach(a: float, b: float, x: float, kmax: int) -> int:
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
    while n < kmax and run_ms(a, b, n) < x:
        n += 1
    while n > 0 and run_ms(a, b, n - 1) >= x:
        n -= 1
    return n


def steps_done(w: Worker, now: float) -> int:
    """Steps the worker has completed by ``now`` (inside a decode run: its finished steps)."""
    if w.kind != DECODE_RUN or now <= w.t0:
        return w.steps
    x = now - w.t0
    k = steps_to_reach(w.a, w.b, x, w.k)
    if run_ms(w.a, w.b, k) > x:
        k -= 1
    return w.steps + k


class Worker:
    """Queue, batch and pending step of one replica; its KV lives in ``cache``."""

    __slots__ = (
        "wid", "cache", "waiting", "prefilling", "decoding", "steps", "kv", "gen", "kind",
        "t0", "k", "a", "b", "end", "chunk", "routed", "growth", "admitted", "preempted",
    )

    def __init__(self, wid: int, cache: BlockCache) -> None:
        self.wid = wid
        self.cache = cache
        self.waiting: deque[Req] = deque()
        self.prefilling: list[Req] = []
        self.decoding: list[tuple[int, int, Req]] = []  # heap of (finish_step, idx, req)
        self.steps = 0  # steps completed
        self.kv = 0  # KV tokens of the decoding sequences
        self.gen = 0  # generation of the pending event (stale heap entries are skipped)
        self.kind = IDLE
        self.t0 = 0.0  # a decode run: start, steps, step cost a + b i
        self.k = 0
        self.a = 0.0
        self.b = 0.0
        self.end = 0.0  # when the pending step or run ends
        self.chunk: list[tuple[Req, int]] = []  # prefill tokens taken by the pending step
        self.routed = 0
        self.growth: list[tuple[int, int, int, Req]] = []  # incremental KV: (step, idx, admits, req)
        self.admitted = 0
        self.preempted = 0


class StepModel:
    """Forms and applies steps; calls back when a request's first token and last token come."""

    __slots__ = (
        "prefill_ms", "decode_ms", "pf", "df", "max_tokens", "max_seqs", "bt", "max_run_steps",
        "on_first", "on_finish", "incremental",
    )

    def __init__(
        self,
        prefill_ms: Callable[[float], float],
        decode_ms: Callable[[int, float], float],
        prefill_speed: float,
        decode_speed: float,
        max_tokens: int,
        max_seqs: int,
        block_tokens: int,
        max_run_steps: int | None,
        on_first: Callable[[Worker, Req, float], None],
        on_finish: Callable[[Worker, Req, float], None],
        incremental: bool = False,
    ) -> None:
        self.prefill_ms = prefill_ms
        self.decode_ms = decode_ms
        self.pf = 1.0 / prefill_speed
        self.df = 1.0 / decode_speed
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.bt = block_tokens
        self.max_run_steps = max_run_steps
        self.on_first = on_first
        self.on_finish = on_finish
        self.incremental = incremental

    def footprint(self, r: Req) -> int:
        """Blocks of the whole request, prompt and output (reserved at admission unless
        allocation is incremental; a request above the capacity can never run)."""
        total = -(-(r.isl + r.osl) // self.bt)
        return total if total >= r.nhash else r.nhash

    def admit(self, w: Worker, r: Req) -> bool:
        first = (r.dev_hits, r.loaded)
        if self.incremental:
            # the prompt, plus the output tokens a preempted request recomputes
            r.length = r.isl + r.generated
            blocks = -(-r.length // self.bt)
            r.held = blocks if blocks >= r.nhash else r.nhash
            if not w.cache.reserve(r, r.held):
                return False
        else:
            r.length = r.isl
            if not w.cache.reserve(r, self.footprint(r)):
                return False
        if r.admits:  # the cache hit statistics are those of the first admission
            r.dev_hits, r.loaded = first
        r.admits += 1
        w.admitted += 1
        r.seq = w.admitted
        new = r.length - r.hits * self.bt
        r.left = new if new > 1 else 1  # at least one prompt token is computed
        return True

    def allocate(self, w: Worker) -> None:
        """Incremental KV: give every sequence that enters a new block in the next step its
        block, preempting the newest running request while none is free."""
        growth = w.growth
        nxt = w.steps + 1
        bt = self.bt
        while growth and growth[0][0] <= nxt:
            step, _, admits, r = heapq.heappop(growth)
            if r.done or admits != r.admits or r.left != 0:
                continue  # finished, or preempted since (its entry is stale)
            while not w.cache.grow(r):
                victim = self.newest_running(w)
                self.preempt(w, victim)
                if victim is r:
                    break
            else:
                heapq.heappush(growth, (step + bt, r.idx, admits, r))

    def newest_running(self, w: Worker) -> Req:
        running = w.prefilling + [e[2] for e in w.decoding]
        return max(running, key=lambda x: x.seq)

    def preempt(self, w: Worker, r: Req) -> None:
        """Free all of ``r``'s KV and put it back at the head of the queue; on readmission it
        recomputes its prompt and the tokens it has produced (prefix cache permitting)."""
        w.preempted += 1
        if r.left > 0:  # still prefilling: only its matched prefix is pinned
            w.prefilling = [x for x in w.prefilling if x is not r]
            w.cache.release(r, r.hits)
        else:
            w.decoding = [e for e in w.decoding if e[2] is not r]
            heapq.heapify(w.decoding)
            done_steps = w.steps - r.decode_from
            w.kv -= r.length + 1 + done_steps
            r.generated += 1 + done_steps
            w.cache.release(r)
        r.private = 0
        r.left = -1  # neither prefilling (> 0) nor decoding (0)
        w.waiting.appendleft(r)

    def start(self, w: Worker, t: float) -> bool:
        """Form the next step (or decode run) at ``t``; False when the worker goes idle."""
        if self.incremental and w.growth:
            self.allocate(w)
        nd = len(w.decoding)
        budget = self.max_tokens - nd
        chunk: list[tuple[Req, int]] = []
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
            max_seqs = self.max_seqs
            while budget > 0 and waiting and nd + len(w.prefilling) < max_seqs:
                r = waiting[0]
                if not self.admit(w, r):
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
            dt = self.prefill_ms(ptoks) * self.pf + onboard
            if nd:
                dt += self.decode_ms(nd, w.kv) * self.df
            w.kind = MIXED
            w.chunk = chunk
            w.end = t + dt
            return True
        if nd:
            k = w.decoding[0][0] - w.steps
            if self.max_run_steps is not None and k > self.max_run_steps:
                k = self.max_run_steps
            if w.growth and w.growth[0][0] - 1 - w.steps < k:
                k = w.growth[0][0] - 1 - w.steps  # stop where a sequence needs a new block
            kv = w.kv
            df = self.df
            a = self.decode_ms(nd, kv) * df
            b = self.decode_ms(nd, kv + nd) * df - a
            w.kind = DECODE_RUN
            w.t0 = t
            w.k = k
            w.a = a
            w.b = b
            w.end = t + run_ms(a, b, k)
            return True
        w.kind = IDLE
        return False

    def cut(self, w: Worker, t: float) -> bool:
        """An arrival at ``t`` joins the next step: end a decode run at the first step
        boundary at or after ``t``. True when the run was shortened (a new event)."""
        if w.kind != DECODE_RUN or t >= w.end:
            return False
        k = steps_to_reach(w.a, w.b, t - w.t0, w.k)
        if k >= w.k:
            return False
        w.k = k
        w.end = w.t0 + run_ms(w.a, w.b, k)
        w.gen += 1
        return True

    def advance(self, w: Worker, t: float) -> None:
        """The worker's pending step or run ended at ``t``: apply it."""
        nd = len(w.decoding)
        if w.kind == MIXED:
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
            self.finish_due(w, t)
            for r in done:
                self.prefill_done(w, r, t)
        elif w.kind == DECODE_RUN:
            w.steps += w.k
            w.kv += nd * w.k
            self.finish_due(w, t)
        w.kind = IDLE

    def finish_due(self, w: Worker, t: float) -> None:
        dec = w.decoding
        steps = w.steps
        while dec and dec[0][0] <= steps:
            r = heapq.heappop(dec)[2]
            w.kv -= r.isl + r.osl
            w.cache.release(r)
            self.on_finish(w, r, t)

    def prefill_done(self, w: Worker, r: Req, t: float) -> None:
        w.cache.commit_prompt(r)
        self.on_first(w, r, t)
        left = r.osl - r.generated  # tokens still to produce, this prefill's token included
        if left <= 1:
            w.cache.release(r)
            self.on_finish(w, r, t)
        else:
            r.decode_from = w.steps
            r.finish_step = w.steps + left - 1
            heapq.heappush(w.decoding, (r.finish_step, r.idx, r))
            w.kv += r.length + 1
            if self.incremental:
                # decode step j writes token length + j: a new block once it passes held blocks
                grow = w.steps + r.held * self.bt - r.length + 1
                if grow <= r.finish_step:
                    heapq.heappush(w.growth, (grow, r.idx, r.admits, r))
