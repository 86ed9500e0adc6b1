"""Incremental KV allocation with preemption (engine option ``kv_allocation``)."""

from __future__ import annotations

import dataclasses

import pytest

from powerfleet.sim.cache import BlockCache
from powerfleet.sim.engine import EngineConfig, simulate
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.profile import default_profile
from powerfleet.sim.request import Req

P = default_profile()
FOUR_BLOCKS = dataclasses.replace(P, kv_capacity_tokens=4 * 512)
INCREMENTAL = EngineConfig(kv_allocation="incremental")


def two_requests(engine: EngineConfig):
    # two 1-block prompts, 1000 output tokens each: 3 blocks each in full, 4 in the worker
    return simulate([0.0, 0.0], [512, 512], [1000, 1000], [(1,), (2,)], 1, RouterPolicy(), FOUR_BLOCKS, engine, 1)


def test_reservation_serialises_what_incremental_allocation_overlaps() -> None:
    res = two_requests(EngineConfig())
    assert res.preemptions == 0 and res.first_token_ms[1] > res.finish_ms[0]  # B waited for A's 3 blocks


def decode(t: float, batch: int, kv: int, steps: int) -> float:
    for _ in range(steps):
        t += P.decode_ms(batch, kv)
        kv += batch
    return t


def test_preemption_frees_the_newest_request_and_recomputes_it_later() -> None:
    # Step 1: A's prompt alone (B arrived while it ran). Step 2: A takes its 2nd block for its
    # first decode step; B is admitted (1 block) and prefilled beside it. Step 3: B takes its
    # 2nd block (4 of 4). At step 514 A needs a 3rd block and none is free: B, the newest, is
    # preempted after 512 tokens; its private block is freed, its prompt block stays cached.
    # B (1024 tokens, 2 blocks) cannot come back until A ends; then it finds its prompt
    # block, recomputes 512 tokens and produces its last 488.
    res = two_requests(INCREMENTAL)
    assert res.preemptions == 1 and not res.dropped
    t1 = P.prefill_ms(512)
    t2 = t1 + P.prefill_ms(512) + P.decode_ms(1, 513)
    assert res.first_token_ms == [pytest.approx(t1), pytest.approx(t2)]
    t3 = decode(t2, 2, 513 + 1 + 513, 511)
    t_a = decode(t3, 1, 513 + 512, 1000 - 513)
    assert res.finish_ms[0] == pytest.approx(t_a, rel=1e-9)
    t_b = decode(t_a + P.prefill_ms(512), 1, 1025, 487)
    assert res.finish_ms[1] == pytest.approx(t_b, rel=1e-9)
    assert res.hit_blocks == [0, 0]  # hit statistics are those of the first admission


def test_grow_takes_a_free_block_evicting_an_unreferenced_one_and_release_frees_it() -> None:
    cache = BlockCache(3, 512)
    old = Req(0, 0.0, 512, 1, (7,))
    assert cache.reserve(old, 1)
    cache.commit_prompt(old)
    cache.release(old)  # block 7 cached, unreferenced
    r = Req(1, 0.0, 1024, 100, (1, 2))
    r.held = 2
    assert cache.reserve(r, 2) and cache.free_blocks() == 1
    assert cache.grow(r) and 7 not in cache.blocks  # the free slot was block 7's: evicted
    assert cache.free_blocks() == 0 and not cache.grow(r) and r.held == 3
    cache.release(r, r.hits)
    assert cache.free_blocks() == 3 and cache.private == 0
