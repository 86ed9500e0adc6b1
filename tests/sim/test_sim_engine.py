"""Engine model, router and replay invariants."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.sim.engine import EngineConfig, simulate
from powerfleet.sim.policy import SLA, RouterOptions, RouterPolicy, parse_policy, parse_sla
from powerfleet.sim.profile import CapCurve, default_profile, load_profile
from powerfleet.sim.replay import parse_window, prepare, replay, replay_arrivals
from powerfleet.sim.trace import TraceRequest

P = default_profile()


def req(t: float, isl: int, osl: int, hashes: tuple[int, ...] | None = None) -> TraceRequest:
    if hashes is None:
        hashes = tuple(range(int(t) * 1000, int(t) * 1000 + -(-isl // 512)))
    return TraceRequest(float(t), isl, osl, hashes)


def test_single_request_matches_the_closed_form() -> None:
    arr = prepare([req(0, 1000, 11)])
    res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, 1, RouterPolicy(), P, EngineConfig(), 1)
    ttft = P.prefill_ms(1000)
    decode = sum(P.decode_ms(1, 1001 + i) for i in range(10))
    assert res.first_token_ms[0] == pytest.approx(ttft, rel=1e-12)
    assert res.finish_ms[0] == pytest.approx(ttft + decode, rel=1e-12)


def test_arrival_cuts_a_decode_run_at_the_next_step_boundary() -> None:
    a_ttft = P.prefill_ms(512)
    steps = [P.decode_ms(1, 513 + i) for i in range(100)]
    t_b = a_ttft + sum(steps[:5]) + 0.5 * steps[5]  # mid step 6
    reqs = [req(0, 512, 101, (1,)), req(t_b, 512, 2, (2,))]
    arr = prepare(reqs)
    arr = dataclasses.replace(arr, arrival_ms=[0.0, t_b])
    res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, 1, RouterPolicy(), P, EngineConfig(), 1)
    boundary = a_ttft + sum(steps[:6])
    mixed = P.prefill_ms(512) + P.decode_ms(1, 519)
    assert res.first_token_ms[1] == pytest.approx(boundary + mixed, rel=1e-9)
    # B then decodes one token alongside A
    assert res.finish_ms[1] == pytest.approx(boundary + mixed + P.decode_ms(2, 520 + 513), rel=1e-9)
    assert res.finish_ms[0] > res.finish_ms[1]


def test_prefix_cache_hit_skips_prefill_of_cached_blocks() -> None:
    reqs = [req(0, 2048, 1, (1, 2, 3, 4)), req(10_000, 2048, 1, (1, 2, 3, 5))]
    s = replay(reqs, 1)
    assert s.cache_hit_rate == pytest.approx(3 / 8)
    arr = prepare(reqs)
    res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, 1, RouterPolicy(), P, EngineConfig(), 1)
    assert res.first_token_ms[1] - 10_000 == pytest.approx(P.prefill_ms(512))


def test_lru_evicts_least_recently_used_unreferenced_blocks() -> None:
    small = dataclasses.replace(P, kv_capacity_tokens=4 * 512)
    reqs = [req(t * 5_000, 1000, 1, h) for t, h in enumerate([(1, 2), (3, 4), (5, 6), (3, 4), (1, 2)])]
    arr = prepare(reqs)
    res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, 1, RouterPolicy(), small, EngineConfig(), 1)
    # (5,6) evicts (1,2); (3,4) hits and becomes most recent; (1,2) then evicts (5,6)
    assert res.hit_blocks == [0, 0, 0, 2, 0]


def test_cache_aware_routing_follows_the_prefix_and_blind_routing_balances() -> None:
    reqs = [req(0, 4096, 1, tuple(range(8))), req(2000, 4096, 1, tuple(range(7)) + (99,))]
    aware = replay(reqs, 2, RouterPolicy(overlap_score_credit=1.0))
    blind = replay(reqs, 2, RouterPolicy(overlap_score_credit=0.0))
    assert aware.requests_per_worker == [2, 0] and aware.cache_hit_rate == pytest.approx(7 / 16)
    assert blind.cache_hit_rate == pytest.approx(7 / 16) or blind.requests_per_worker == [1, 1]


def test_temperature_zero_ties_go_to_the_lowest_worker() -> None:
    s = replay([req(0, 100, 1)], 4)
    assert s.requests_per_worker == [1, 0, 0, 0]


def test_softmax_sampling_is_seeded(tiny_requests) -> None:
    pol = RouterPolicy(temperature=1.0)
    a = replay(tiny_requests, 3, pol, seed=5)
    b = replay(tiny_requests, 3, pol, seed=5)
    assert a == b
    others = {tuple(replay(tiny_requests, 3, pol, seed=s).requests_per_worker) for s in range(6)}
    assert len(others) > 1


def test_same_seed_same_inputs_gives_byte_identical_json(tiny_requests) -> None:
    sla = SLA(ttft_ms=2000, itl_ms=50)
    pol = RouterPolicy(temperature=0.5, overlap_score_credit=0.6)
    dumps = [
        json.dumps(replay(tiny_requests, 3, pol, seed=9, sla=sla, jitter_ms=700).to_json_dict(), sort_keys=True)
        for _ in range(2)
    ]
    assert dumps[0] == dumps[1]


def test_common_random_numbers_do_not_depend_on_the_policy(tiny_requests) -> None:
    a1 = prepare(tiny_requests, seed=3, jitter_ms=900)
    a2 = prepare(tiny_requests, seed=3, jitter_ms=900)
    assert a1 == a2 and a1.arrival_ms != prepare(tiny_requests, seed=4, jitter_ms=900).arrival_ms
    hot = RouterPolicy(temperature=1.0)
    cold = RouterPolicy(overlap_score_credit=0.2)
    alone = replay_arrivals(a1, 3, cold, 3)
    replay_arrivals(a1, 3, hot, 3)  # consumes router draws; must not leak into the next replay
    assert replay_arrivals(a1, 3, cold, 3) == alone
    assert a1 == a2


def test_requests_too_big_for_a_worker_are_dropped_with_a_reason() -> None:
    small = dataclasses.replace(P, kv_capacity_tokens=8 * 512)
    reqs = [req(0, 512, 3), req(1, 512 * 20, 3), req(2, 700, 3)]
    s = replay(reqs, 2, profile=small)
    assert (s.requests, s.completed, s.dropped) == (3, 2, 1)
    assert s.dropped_reasons == {"exceeds_kv_capacity": 1}


def test_power_cap_hook_slows_prefill_more_than_decode() -> None:
    c = CapCurve()
    assert c.prefill_throughput(1.0) == c.decode_throughput(1.0) == 1.0
    assert 1 / c.prefill_throughput(0.7) == pytest.approx(1.30, abs=0.03)  # Splitwise: 70 % cap -> x1.30
    assert c.decode_throughput(0.7) == 1.0
    assert 1 / c.prefill_throughput(600 / 700) == pytest.approx(1.11, abs=0.01)
    assert 1 / c.decode_throughput(300 / 700) == pytest.approx(1.07, abs=0.01)
    assert c.decode_throughput(0.3) < 0.4  # cliff near the 200 W floor
    reqs = [req(0, 4000, 50)]
    full, capped = replay(reqs, 1), replay(reqs, 1, cap_fraction=0.5)
    assert capped.ttft_ms.mean > full.ttft_ms.mean * 1.3
    with pytest.raises(ValueError, match="cap fraction"):
        replay(reqs, 1, cap_fraction=1.5)


def test_profile_tables_load_and_interpolate(tmp_path: Path) -> None:
    spec = {
        "name": "t", "source": "test", "gpus_per_replica": 2, "kv_capacity_tokens": 100000,
        "prefill": {"tokens": [0, 1000, 2000], "ms": [10, 110, 230]},
        "decode": {"batch": [1, 9], "kv_tokens": [0, 10000], "ms": [[10, 20], [12, 32]]},
    }
    p = tmp_path / "p.json"
    p.write_text(json.dumps(spec))
    prof = load_profile(p)
    assert prof.prefill_ms(500) == pytest.approx(60)
    assert prof.prefill_ms(3000) == pytest.approx(350)  # extrapolates the last segment
    assert prof.decode_ms(5, 5000) == pytest.approx((15 + 22) / 2)
    s = replay([req(0, 1500, 20)], 2, profile=prof)
    assert s.gpus == 4 and s.profile == "t"
    spec["prefill"]["tokens"] = [0, 5, 1]
    p.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="strictly increasing"):
        load_profile(p)


def test_policy_and_sla_parsing_errors_say_what_was_wrong() -> None:
    assert parse_policy('{"temperature": 0.5}').temperature == 0.5
    with pytest.raises(ValueError, match="overlap_score_credit"):
        parse_policy('{"overlap_score_credit": -0.5}')
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_policy("{")
    with pytest.raises(ValueError, match="bogus"):
        parse_policy('{"bogus": 1}')
    with pytest.raises(ValueError, match="both"):
        parse_sla('{"ttft_ms": 100}')
    assert parse_sla('{"e2e_ms": 100}').e2e_ms == 100
    assert parse_window("10:") == (10.0, None)
    for bad in ("5", "a:b", "9:3", "-1:4"):
        with pytest.raises(ValueError):
            parse_window(bad)


@st.composite
def traces(draw):
    n = draw(st.integers(1, 25))
    out = []
    t = 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 10.0, 300.0, 2000.0]))
        prefix = draw(st.integers(0, 3))
        own = draw(st.integers(0, 4))
        hashes = tuple(range(prefix)) + tuple(draw(st.integers(100, 10**6)) for _ in range(own))
        isl = max(0, len(hashes) * 512 - draw(st.integers(0, 511))) if hashes else 0
        out.append(TraceRequest(t, isl, draw(st.integers(0, 60)), hashes))
    return out


policies = st.builds(
    RouterPolicy,
    overlap_score_credit=st.sampled_from([0.0, 0.5, 1.0]),
    overlap_score_credit_decay=st.sampled_from([0.0, 1.0]),
    prefill_load_scale=st.sampled_from([0.0, 1.0, 4.0]),
    temperature=st.sampled_from([0.0, 0.7]),
    decode_active_request_weight=st.sampled_from([0.0, 8.0]),
)


router_options = st.builds(
    RouterOptions,
    router_queue_threshold=st.sampled_from([None, None, 0.5, 2.0]),
    router_queue_policy=st.sampled_from(["fcfs", "lcfs", "wspt"]),
    router_prefill_load_model=st.sampled_from(["none", "ais"]),
    kv_event_lag_ms=st.sampled_from([0.0, 0.0, 40.0]),
    router_track_output_blocks=st.booleans(),
    router_tie_break=st.sampled_from(["lowest", "random"]),
)


@settings(max_examples=120, deadline=None)
@given(reqs=traces(), pol=policies, workers=st.integers(1, 3), seed=st.integers(0, 5),
       blocks=st.sampled_from([6, 12, 10**6]), max_seqs=st.sampled_from([1, 2, 256]),
       tier=st.sampled_from([0, 3]), alloc=st.sampled_from(["reserve", "incremental"]), opts=router_options)
def test_conservation_and_causality(reqs, pol, workers, seed, blocks, max_seqs, tier, alloc, opts) -> None:
    prof = dataclasses.replace(P, kv_capacity_tokens=blocks * 512)
    arr = prepare(reqs, seed=seed, jitter_ms=50)
    eng = EngineConfig(max_num_seqs=max_seqs, max_num_batched_tokens=1024, host_cache_blocks=tier,
                       disk_cache_blocks=tier, shared_cache_blocks=2 * tier, kv_allocation=alloc)
    res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, workers, pol, prof, eng, seed, router=opts)
    assert not any(why == "not_scheduled" for why in res.dropped.values())
    for i in range(len(reqs)):
        if i in res.dropped:
            assert math.isnan(res.finish_ms[i])
            continue
        a, f, e = res.arrival_ms[i], res.first_token_ms[i], res.finish_ms[i]
        assert a <= f <= e, (a, f, e)
    s = replay_arrivals(arr, workers, pol, seed, profile=prof, engine=eng, router=opts)
    assert s.completed + s.dropped == s.requests == len(reqs)
    assert sum(s.requests_per_worker) == s.requests - s.dropped
    if s.completed:
        assert s.ttft_ms.mean <= s.e2e_ms.mean
        assert s.ttft_ms.p99 <= s.e2e_ms.p99 + 1e-9


def test_host_tier_keeps_evicted_blocks_and_loads_them_instead_of_prefilling() -> None:
    small = dataclasses.replace(P, kv_capacity_tokens=4 * 512)
    eng = EngineConfig(host_cache_blocks=10, host_load_ms_per_block=2.0)
    reqs = [req(t * 5_000, 1000, 1, h) for t, h in enumerate([(1, 2), (3, 4), (5, 6), (1, 2)])]
    arr = prepare(reqs)
    res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, 1, RouterPolicy(), small, eng, 1)
    assert res.hit_blocks == [0, 0, 0, 0] and res.loaded_blocks == [0, 0, 0, 2]
    assert res.first_token_ms[3] - 15_000 == pytest.approx(P.prefill_ms(1) + 2 * 2.0)
    s = replay(reqs, 1, profile=small, engine=eng)
    assert s.offload_hit_rate == pytest.approx(2 / 8) and s.cache_hit_rate == 0
    off = replay(reqs, 1, profile=small)
    assert off.offload_hit_rate == 0 and off.ttft_ms.mean > s.ttft_ms.mean


def test_offload_weights_matter_only_when_a_tier_exists(tiny_requests) -> None:
    small = dataclasses.replace(P, kv_capacity_tokens=20 * 512)
    eng = EngineConfig(host_cache_blocks=50, disk_cache_blocks=50, shared_cache_blocks=100)
    lo = RouterPolicy(host_cache_hit_weight=0.0, disk_cache_hit_weight=0.0)
    hi = RouterPolicy(host_cache_hit_weight=1.0, disk_cache_hit_weight=1.0, shared_cache_multiplier=1.0)
    assert replay(tiny_requests, 3, lo, profile=small).ttft_ms == replay(tiny_requests, 3, hi, profile=small).ttft_ms
    a = replay(tiny_requests, 3, lo, profile=small, engine=eng)
    b = replay(tiny_requests, 3, hi, profile=small, engine=eng)
    assert a.offload_hit_rate > 0 and b.offload_hit_rate > 0
    assert a.completed == b.completed
    assert (a.requests_per_worker, a.ttft_ms) != (b.requests_per_worker, b.ttft_ms)


def test_engine_settings_parse_with_named_errors() -> None:
    from powerfleet.sim.engine import parse_engine

    assert parse_engine('{"host_cache_blocks": 5}').host_cache_blocks == 5
    with pytest.raises(ValueError, match="engine max_num_seqs"):
        parse_engine('{"max_num_seqs": 0}')
    with pytest.raises(ValueError, match="engine is not valid JSON"):
        parse_engine("{")


@settings(max_examples=80, deadline=None)
@given(reqs=traces(), pol=policies, workers=st.integers(1, 3), seed=st.integers(0, 5),
       alloc=st.sampled_from(["reserve", "incremental"]), blocks=st.sampled_from([8, 10**6]), opts=router_options)
def test_event_skipping_matches_step_by_step_simulation(reqs, pol, workers, seed, alloc, blocks, opts) -> None:
    arr = prepare(reqs, seed=seed, jitter_ms=500)
    eng = EngineConfig(max_num_batched_tokens=1024, kv_allocation=alloc)
    prof = dataclasses.replace(P, kv_capacity_tokens=blocks * 512)
    args = (arr.arrival_ms, arr.isl, arr.osl, arr.hashes, workers, pol, prof, eng, seed)
    fast = simulate(*args, router=opts)
    slow = simulate(*args, max_run_steps=1, router=opts)
    assert fast.worker == slow.worker and fast.dropped == slow.dropped and fast.hit_blocks == slow.hit_blocks
    for x, y in zip(fast.first_token_ms + fast.finish_ms, slow.first_token_ms + slow.finish_ms):
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-9, abs=1e-6)


def test_warm_start_equals_the_warm_up_span_replayed_with_only_the_window_scored(tiny_requests) -> None:
    pol = RouterPolicy(temperature=0.5)
    warm = replay(tiny_requests, 2, pol, 3, window=(12, 24), warmup_s=8)
    span = prepare(tiny_requests, seed=3, window=(4, 24), warmup_s=0)  # the same span, cold
    res = simulate(span.arrival_ms, span.isl, span.osl, span.hashes, 2, pol, P, EngineConfig(), 7)
    inside = [i for i, a in enumerate(span.arrival_ms) if a >= 8_000]  # the window's requests
    ttft = [res.first_token_ms[i] - res.arrival_ms[i] for i in inside]
    assert warm.requests == len(inside) > 0 and any(a < 8_000 for a in span.arrival_ms)
    assert warm.ttft_ms.mean == pytest.approx(sum(ttft) / len(ttft), abs=1e-6)
    cold = replay(tiny_requests, 2, pol, 3, window=(12, 24), warmup_s=0)
    assert cold.requests == warm.requests and cold.ttft_ms != warm.ttft_ms
    with pytest.raises(ValueError, match="warm-up"):
        prepare(tiny_requests, window=(5, 10), warmup_s=-1)


@settings(max_examples=40, deadline=None)
@given(reqs=traces(), pol=policies, workers=st.integers(1, 3), seed=st.integers(0, 5),
       split=st.sampled_from([0.0, 100.0, 2500.0]), alloc=st.sampled_from(["reserve", "incremental"]),
       opts=router_options)
def test_a_run_stopped_and_forked_under_the_same_policy_equals_one_run(reqs, pol, workers, seed, split, alloc,
                                                                       opts) -> None:
    from powerfleet.sim.engine import Simulation

    arr = prepare(reqs, seed=seed, jitter_ms=500)
    args = (arr.arrival_ms, arr.isl, arr.osl, arr.hashes, workers, pol, dataclasses.replace(P, kv_capacity_tokens=
            10 * 512), EngineConfig(max_num_batched_tokens=1024, kv_allocation=alloc), seed)
    whole = simulate(*args, router=opts)
    forked = Simulation(*args, router=opts).run(until=split).fork(pol).run().result()
    assert forked == whole or (forked.worker == whole.worker and forked.dropped == whole.dropped and all(
        (math.isnan(x) and math.isnan(y)) or x == y
        for x, y in zip(forked.first_token_ms + forked.finish_ms, whole.first_token_ms + whole.finish_ms)))


def test_a_shared_warm_up_is_served_by_the_current_settings(tiny_requests) -> None:
    from powerfleet.sim.replay import warm_snapshot

    cur, cand = RouterPolicy(), RouterPolicy(overlap_score_credit=0.0, temperature=1.0)
    arr = prepare(tiny_requests, seed=1, window=(15, 30))
    warm = warm_snapshot(arr, 3, cur, 1)
    shared = replay_arrivals(arr, 3, cand, 1, warm=warm)
    assert replay_arrivals(arr, 3, cand, 1, warm=warm) == shared  # the snapshot is not consumed
    assert replay_arrivals(arr, 3, cur, 1, warm=warm) == replay_arrivals(arr, 3, cur, 1)
    own = replay_arrivals(arr, 3, cand, 1)  # the warm-up replayed under the candidate itself
    assert own.requests == shared.requests and own.ttft_ms != shared.ttft_ms
