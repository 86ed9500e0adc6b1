"""Dynamo's router options, one hand-computed case each (powerfleet.sim.router)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.sim.cache import BlockCache
from powerfleet.sim.engine import EngineConfig, simulate
from powerfleet.sim.policy import RouterOptions, RouterPolicy, parse_router_options
from powerfleet.sim.profile import default_profile
from powerfleet.sim.request import Req
from powerfleet.sim.router import Router

P = default_profile()


def run(reqs: list[tuple[float, int, int, tuple[int, ...]]], workers: int, opts: RouterOptions | None = None,
        engine: EngineConfig | None = None, policy: RouterPolicy | None = None, seed: int = 1):
    return simulate([r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs], [r[3] for r in reqs],
                    workers, policy or RouterPolicy(), P, engine or EngineConfig(), seed, router=opts)


def blocks(base: int, n: int) -> tuple[int, ...]:
    return tuple(range(base, base + n))


BURST = [(0.0, 2048, 1, blocks(100 * k, 4)) for k in range(5)]  # five 4-block prompts at once
SMALL_BATCH = EngineConfig(max_num_batched_tokens=1024)


@pytest.mark.parametrize("policy, order", [("fcfs", [2, 3, 4]), ("lcfs", [4, 3, 2])])
def test_queue_holds_a_burst_while_every_worker_is_busy_and_releases_in_order(policy, order) -> None:
    # Limit 1.0 x 1024 tokens. Requests 0 and 1 fill both workers (2048 pending tokens each);
    # 2, 3, 4 are held. Each prefill takes two 1024-token chunks (2P). When worker 0 ends its
    # prefill at 2P one held request goes there; worker 1's end at the same instant releases
    # the next; the last waits for the next prefill to end at 4P and is done at 6P.
    p = P.prefill_ms(1024)
    opts = RouterOptions(router_queue_threshold=1.0, router_queue_policy=policy)
    res = run(BURST, 2, opts, SMALL_BATCH)
    assert res.first_token_ms[:2] == [pytest.approx(2 * p)] * 2
    released = [res.first_token_ms[i] for i in order]
    assert released == [pytest.approx(4 * p), pytest.approx(4 * p), pytest.approx(6 * p)]
    assert [res.worker[i] for i in order] == [0, 1, 0]
    free = run(BURST, 2, None, SMALL_BATCH)  # no queue: everything routed at once
    assert sorted(free.routed_per_worker) == [2, 3] and free.worker[:3] == [0, 1, 0]


def test_wspt_releases_the_shortest_prompt_first() -> None:
    burst = BURST[:2] + [(0.0, 2048, 1, blocks(900, 4)), (0.0, 512, 1, blocks(950, 1))]
    res = run(burst, 2, RouterOptions(router_queue_threshold=1.0, router_queue_policy="wspt"), SMALL_BATCH)
    # At 2P worker 0 frees first. wspt releases the 1-block prompt there; 512 pending tokens
    # stay under the limit, so the 4-block one follows it to worker 0 at once. fcfs releases
    # the 4-block one first, which makes worker 0 busy again: the other waits for worker 1.
    assert res.worker[2:] == [0, 0] and res.first_token_ms[3] < res.first_token_ms[2]
    fcfs = run(burst, 2, RouterOptions(router_queue_threshold=1.0), SMALL_BATCH)
    assert fcfs.worker[2:] == [0, 1]


def test_late_kv_events_change_a_routing_choice() -> None:
    # A (blocks 0..7) goes to worker 0, B (blocks 50..57) to worker 1; both finish at PA.
    # C shares B's 8 blocks: seen at once it costs 1 block on worker 1 and 9 on worker 0.
    # With the events 1000 ms late the router has not seen B's blocks: a tie, worker 0.
    pa = P.prefill_ms(4096)
    base = [(0.0, 4096, 1, blocks(0, 8)), (0.0, 4096, 1, blocks(50, 8))]
    c = (pa + 1.0, 4608, 1, blocks(50, 8) + (99,))
    assert run(base + [c], 2).worker == [0, 1, 1]
    assert run(base + [c], 2, RouterOptions(kv_event_lag_ms=1000)).worker == [0, 1, 0]
    late = (pa + 1001.0, *c[1:])
    assert run(base + [late], 2, RouterOptions(kv_event_lag_ms=1000)).worker == [0, 1, 1]


def test_random_tie_break_is_uniform_over_equal_costs_and_seeded() -> None:
    # Every request arrives at an idle, empty cluster: four equal costs each time.
    reqs = [(k * 10_000.0, 512, 1, (10_000 + k,)) for k in range(400)]
    res = run(reqs, 4, RouterOptions(router_tie_break="random"), seed=7)
    rng = random.Random(7)
    assert res.worker == [int(rng.random() * 4) for _ in reqs]  # one draw per tie
    counts = Counter(res.worker)
    assert all(70 <= counts[w] <= 130 for w in range(4)), counts
    assert run(reqs, 4).worker == [0] * 400  # the historical rule: the lowest index


def _router(opts: RouterOptions, steps: list[int] | None = None, workers: int = 1,
            policy: RouterPolicy | None = None) -> Router:
    caches = [BlockCache(10_000, 512) for _ in range(workers)]
    step = steps if steps is not None else [0]
    return Router(policy or RouterPolicy(), caches, 512, 1, opts, predict_prefill_ms=lambda n: float(n),
                  steps_at=lambda wid, now: step[0])


def test_ais_prefill_load_decays_the_oldest_prompt_over_its_predicted_time() -> None:
    rt = _router(RouterOptions(router_prefill_load_model="ais"))  # predicted 1 ms per token
    a, b = Req(0, 0.0, 4096, 10, blocks(0, 8)), Req(1, 500.0, 1024, 10, blocks(50, 2))
    assert rt.route(a, 0.0) == 0 and rt.route(b, 500.0) == 0
    assert rt.loads(1024.0) == [pytest.approx(4096 - 4096 * 1024 / 4096 + 1024)]
    assert rt.loads(9000.0) == [pytest.approx(1024)]  # fully decayed, never below zero
    rt.prefill_done(0, a, 2000.0)
    assert rt.loads(2256.0) == [pytest.approx(1024 - 256)]  # b decays from 2000 on
    assert _router(RouterOptions()).loads(5.0) == [0]


def test_output_blocks_are_counted_as_tokens_are_generated() -> None:
    step = [0]
    rt = _router(RouterOptions(router_track_output_blocks=True), step)
    r = Req(0, 0.0, 1000, 2000, blocks(0, 2))
    rt.route(r, 0.0)
    rt.prefill_done(0, r, 10.0, step=1)  # 1 token after step 1; 1000 + g crosses 1024 at g = 25
    probe = Req(1, 0.0, 0, 1, ())
    for s, want in ((24, 2), (25, 3), (536, 3), (537, 4)):
        step[0] = s
        rt.route(probe, 0.0)
        assert rt.blocks[0] == want + (rt.active[0] - 1), s  # each probe adds one 1-block request
    rt.complete(0, r)
    assert rt.blocks[0] == rt.active[0]


def test_credit_above_one_counts_a_cached_block_for_more() -> None:
    rt = _router(RouterOptions(), workers=2, policy=RouterPolicy(overlap_score_credit=2.0))
    rt.caches[1].blocks.update({0: 0, 1: 0})
    costs, overlaps = rt.costs(Req(0, 0.0, 3072, 1, blocks(0, 6)))
    assert costs == [6.0, 2.0] and overlaps == [0, 2]  # 6 - 2 x 2 blocks
    costs, _ = rt.costs(Req(0, 0.0, 1024, 1, blocks(0, 2)))
    assert costs == [2.0, 0.0]  # clamped at zero


def test_router_options_parse_with_named_errors() -> None:
    assert parse_router_options('{"router_queue_threshold": 2}').router_queue_threshold == 2
    with pytest.raises(ValueError, match="router router_queue_policy"):
        parse_router_options('{"router_queue_policy": "lifo"}')
    with pytest.raises(ValueError, match="--router kv_event_lag_ms"):
        parse_router_options('{"kv_event_lag_ms": -1}', "--router")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(obj=st.dictionaries(st.sampled_from(list(RouterOptions.model_fields) + ["bogus"]), json_values, max_size=4))
def test_router_options_parser_accepts_or_names_the_problem(obj) -> None:
    import json

    try:
        got = parse_router_options(json.dumps(obj), "--router")
    except ValueError as exc:
        assert str(exc).startswith("--router")
    else:
        assert isinstance(got, RouterOptions)
