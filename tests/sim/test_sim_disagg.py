"""Disaggregated replay (sim/disagg.py, sim/decode.py): worked cases and invariants."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.sim.decode import decode_policy
from powerfleet.sim.disagg import DEFAULT_KV_TRANSFER_GB_S, DisaggSimulation, Pools, replay, replay_batches, transfer_ms_per_token
from powerfleet.sim.engine import EngineConfig
from powerfleet.sim.policy import RouterOptions, RouterPolicy
from powerfleet.sim.profile import default_profile
from powerfleet.sim.replay import prepare
from powerfleet.sim.trace import TraceRequest

P = default_profile()
KV_MS = 327_680 / 64e9 * 1000.0  # one token of Llama-3-70B KV over 64 GB/s


def req(t: float, isl: int, osl: int, hashes: tuple[int, ...]) -> TraceRequest:
    return TraceRequest(float(t), isl, osl, hashes)


def run(reqs: list[TraceRequest], pools: Pools, policy: RouterPolicy | None = None, **kw):  # type: ignore[no-untyped-def]
    arr = prepare(reqs, warmup_s=0)
    return DisaggSimulation(arr, pools, policy or RouterPolicy(), 0, **kw).run()


def test_transfer_time_is_prompt_bytes_over_the_link() -> None:
    # 4,096 tokens x 320 KiB = 1.342 GB; at 64 GB/s 20.97 ms, at 6.4 GB/s ten times that
    # (Dynamo 1.6.1's replay gives 20.971520 and 209.7152 ms with the same inputs)
    assert 4096 * transfer_ms_per_token(327_680, 64.0) == pytest.approx(20.97152, rel=1e-12)
    assert 4096 * transfer_ms_per_token(327_680, 6.4) == pytest.approx(209.7152, rel=1e-12)
    assert DEFAULT_KV_TRANSFER_GB_S == 64.0 and P.kv_bytes_per_token == 327_680


def test_one_request_by_hand() -> None:
    """Prefill 1,000 tokens, move their KV, then 11 decode steps: the first one is the first token."""
    sim = run([req(0, 1000, 11, (1, 2))], Pools(2, 3))
    res = sim.result()
    prefill = P.prefill_ms(1000)
    joins = prefill + 1000 * KV_MS
    steps = [P.decode_ms(1, 1000 + i) for i in range(11)]  # the KV read grows one token a step
    assert sim.prefill.handoffs == [(pytest.approx(prefill, rel=1e-12), 0)]
    assert res.first_token_ms[0] == pytest.approx(joins + steps[0], rel=1e-12)
    assert res.finish_ms[0] == pytest.approx(joins + sum(steps), rel=1e-9)
    s = replay([req(0, 1000, 11, (1, 2))], Pools(2, 3))
    assert s.ttft_ms.mean == pytest.approx(joins + steps[0], abs=1e-6)
    assert s.itl_ms.mean == pytest.approx(sum(steps[1:]) / 10, abs=1e-6)
    assert s.workers == 5 and s.gpus == 20
    assert s.disaggregated.kv_transfer_ms.mean == pytest.approx(5.12, abs=1e-6)
    assert s.disaggregated.requests_per_decode_worker == [1, 0, 0]
    assert s.to_json_dict()["schema"] == "powerfleet.sim.replay/v1"


def test_the_prefill_router_follows_the_prefix_and_the_decode_router_the_load() -> None:
    x = req(0, 2048, 50, (7, 8, 9, 10))
    a = req(0, 2048, 50, (1, 2, 3, 4))
    b = req(300, 2048, 50, (1, 2, 3, 9))  # both prefills are done by then; x and a still decode
    sim = run([x, a, b], Pools(2, 2))
    res = sim.result()
    assert res.worker == [0, 1, 1]  # a: worker 0 has x's prompt pending; b: a's cached prefix wins
    assert res.hit_blocks == [0, 0, 3]
    assert sim.decode.where == [0, 1, 0]  # by load: a avoids x's worker; b ties and takes the lowest
    blind = run([x, a, b], Pools(2, 2), RouterPolicy(overlap_score_credit=0.0)).result()
    assert blind.worker == [0, 1, 0] and blind.hit_blocks == [0, 0, 0]  # without credit: a tie, no hit
    assert decode_policy(RouterPolicy(overlap_score_credit=1.0, prefill_load_scale=8, temperature=0.5)) == \
        RouterPolicy(overlap_score_credit=0.0, prefill_load_scale=0.0, temperature=0.5)


def test_a_prompt_behind_a_long_one_reuses_the_blocks_already_computed() -> None:
    """A's 40 blocks take three 8,192-token steps; B (the same 40 blocks and one more) is
    admitted in the third, when A's first 32 blocks are computed and cached (as vLLM caches
    each full block once computed), so B computes only the rest."""
    a = req(0, 40 * 512, 5, tuple(range(40)))
    b = req(1, 41 * 512, 5, tuple(range(41)))
    res = run([a, b], Pools(1, 1)).result()
    assert res.hit_blocks == [0, 32]
    steps = [P.prefill_ms(8192), P.prefill_ms(8192), P.prefill_ms(8192)]  # A 4,096 + B 4,096 in the third
    assert run([a, b], Pools(1, 1)).prefill.handoffs[0] == (pytest.approx(sum(steps), rel=1e-12), 0)


def test_the_pools_are_independent() -> None:
    """The decode pool never changes what the prefill pool did, and a decode pool fed the same
    handoffs does the same whatever the prefill pool's size."""
    reqs = [req(i * 300, 1500 + 200 * (i % 3), 30 + i, (i % 4, 100 + i, 200 + i)) for i in range(12)]
    one, four = run(reqs, Pools(2, 1)), run(reqs, Pools(2, 4))
    assert one.prefill.handoffs == four.prefill.handoffs
    assert one.result().worker == four.result().worker
    assert one.result().hit_blocks == four.result().hit_blocks
    assert max(x for x in four.decode.where) > 0
    # a slower prefill pool only moves handoffs later: each request's decode time is unchanged
    # when it decodes alone (one decode worker per request)
    a, b = run(reqs, Pools(1, 12)), run(reqs, Pools(6, 12))
    for i in range(len(reqs)):
        assert a.decode.finish[i] - a.decode.first[i] == pytest.approx(b.decode.finish[i] - b.decode.first[i], rel=1e-9)


def test_refusals_are_one_clear_line() -> None:
    with pytest.raises(ValueError, match="incremental"):
        run([req(0, 10, 2, (1,))], Pools(1, 1), engine=EngineConfig(kv_allocation="incremental"))
    with pytest.raises(ValueError, match=">= 1 prefill and >= 1 decode"):
        Pools(0, 1)
    with pytest.raises(ValueError, match="kv_transfer_gb_s"):
        Pools(1, 1, kv_transfer_gb_s=0.0)
    from dataclasses import replace
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        run([req(0, 10, 2, (1,))], Pools(1, 1, prefill_profile=replace(P, kv_bytes_per_token=None),
                                           decode_profile=replace(P, kv_bytes_per_token=None)))


@st.composite
def traffic(draw: st.DrawFn) -> list[TraceRequest]:
    n = draw(st.integers(1, 18))
    t = 0.0
    out = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 5.0, 40.0, 300.0, 2000.0]))
        isl = draw(st.integers(1, 4000))
        blocks = -(-isl // 512)
        root = draw(st.integers(0, 2))
        hashes = tuple([root] + [1000 * i + k for k in range(1, blocks)])
        out.append(req(t, isl, draw(st.integers(0, 60)), hashes))
    return out


POLICIES = st.builds(RouterPolicy, overlap_score_credit=st.sampled_from([0.0, 1.0]),
                     prefill_load_scale=st.sampled_from([0.0, 1.0, 4.0]), temperature=st.sampled_from([0.0, 0.7]),
                     decode_active_request_weight=st.sampled_from([0.0, 8.0]))


@settings(max_examples=40, deadline=None)
@given(traffic(), st.integers(1, 3), st.integers(1, 3), POLICIES, st.sampled_from([64.0, 6.4]))
def test_every_request_completes_once_after_its_prefill_and_transfer(reqs, p, d, policy, gb_s) -> None:  # type: ignore[no-untyped-def]
    pools = Pools(p, d, kv_transfer_gb_s=gb_s)
    sim = run(reqs, pools, policy)
    res = sim.result()
    assert res.dropped == {}
    assert sorted(i for _, i in sim.prefill.handoffs) == list(range(len(reqs)))  # one handoff each
    assert sum(w.routed for w in sim.decode.ws) == len(reqs)
    ends = dict((i, t) for t, i in sim.prefill.handoffs)
    for i, r in enumerate(reqs):
        prefill_alone = P.prefill_ms(max(1, r.input_length - res.hit_blocks[i] * 512))
        transfer = r.input_length * transfer_ms_per_token(327_680, gb_s)
        assert res.first_token_ms[i] - res.arrival_ms[i] >= prefill_alone + transfer - 1e-9
        assert res.first_token_ms[i] >= ends[i] + transfer + P.decode_ms(1, 0) - 1e-9
        assert res.finish_ms[i] >= res.first_token_ms[i]
    s = replay(reqs, pools, policy)
    assert s.completed == len(reqs) and s.dropped == 0


@settings(max_examples=30, deadline=None)
@given(traffic(), st.integers(1, 3), st.integers(1, 3))
def test_a_decode_worker_per_request_never_worsens_anyones_itl(reqs, p, d) -> None:  # type: ignore[no-untyped-def]
    """On the same arrivals, decoding alone (as many decode workers as requests) is never slower
    per token than sharing d workers."""
    shared = run(reqs, Pools(p, d)).result()
    alone = run(reqs, Pools(p, len(reqs))).result()
    for i, r in enumerate(reqs):
        if r.output_length > 1:
            itl = (shared.finish_ms[i] - shared.first_token_ms[i]) / (r.output_length - 1)
            itl_alone = (alone.finish_ms[i] - alone.first_token_ms[i]) / (r.output_length - 1)
            assert itl_alone <= itl + 1e-9


@settings(max_examples=25, deadline=None)
@given(traffic(), st.integers(1, 3), st.integers(1, 3), POLICIES, st.floats(-100.0, 6000.0))
def test_stopping_and_forking_equals_one_run_and_skipping_equals_stepping(reqs, p, d, policy, stop) -> None:  # type: ignore[no-untyped-def]
    opts = RouterOptions(router_tie_break="random", router_track_output_blocks=True)
    arr = prepare(reqs, warmup_s=0)
    whole = DisaggSimulation(arr, Pools(p, d), policy, 3, router=opts).run().result()
    forked = DisaggSimulation(arr, Pools(p, d), policy, 3, router=opts).run(until=stop).fork(policy).run().result()
    assert forked == whole
    stepped = DisaggSimulation(arr, Pools(p, d), policy, 3, router=opts, max_run_steps=1).run().result()
    assert stepped.worker == whole.worker
    for a, b in zip(stepped.first_token_ms + stepped.finish_ms, whole.first_token_ms + whole.finish_ms):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-6)


def test_a_warm_start_and_its_batches_are_deterministic() -> None:
    reqs = [req(i * 250, 900 + 37 * i, 20 + i % 7, (i % 3, 50 + i)) for i in range(60)]
    arr = prepare(reqs, window=(7.5, 15.0))
    assert arr.scored is not None
    from powerfleet.sim.disagg import warm_snapshot
    warm = warm_snapshot(arr, Pools(2, 2), RouterPolicy(), 0)
    assert isinstance(warm, DisaggSimulation)
    a, parts = replay_batches(arr, Pools(2, 2), RouterPolicy(prefill_load_scale=4.0), 0, batches=4, warm=warm)
    b, _ = replay_batches(arr, Pools(2, 2), RouterPolicy(prefill_load_scale=4.0), 0, batches=4, warm=warm)
    assert json.dumps(a.to_json_dict()) == json.dumps(b.to_json_dict())
    assert a.requests == sum(x.requests for x in parts) == sum(arr.scored)
    assert not math.isnan(a.ttft_ms.mean or math.nan)


def test_the_commands_replay_and_sweep_the_pools_and_refuse_bad_options_in_one_line() -> None:
    from tests.sim.test_sim_cli import TINY, run as cli

    args = ("--trace", str(TINY), "--workers", "2", "--prefill-workers", "3", "--kv-transfer-gb-s", "16")
    a = cli("sim", "replay", *args, "--json")
    assert a.returncode == 0, a.stderr
    d = json.loads(a.stdout)
    assert d["schema"] == "powerfleet.sim.replay/v1" and d["workers"] == 5 and d["gpus"] == 20
    assert d["disaggregated"]["prefill_workers"] == 3 and d["disaggregated"]["kv_transfer_gb_s"] == 16
    assert sum(d["disaggregated"]["requests_per_decode_worker"]) == d["requests"]
    sw = cli("retune", "sweep", *args, "--objective", "ttft", "--current", "{}", "--processes", "1", "--no-search",
             "--json")
    assert sw.returncode == 0, sw.stderr
    assert json.loads(sw.stdout)["workers"] == 5
    assert json.loads(sw.stdout)["held_knobs"] == ["prefill_load_scale"]
    text = cli("retune", "sweep", *args, "--objective", "ttft", "--current", "{}", "--processes", "1", "--no-search")
    assert text.returncode == 0, text.stderr
    assert "held at the current value (no effect on this replay): prefill_load_scale" in text.stdout, text.stdout
    for bad, msg in ((("--prefill-workers", "0"), "--prefill-workers must be >= 1"),
                     (("--prefill-workers", "1", "--kv-transfer-gb-s", "0"), "--kv-transfer-gb-s"),
                     (("--prefill-profile", str(TINY)), "--prefill-profile needs --prefill-workers")):
        out = cli("sim", "replay", "--trace", str(TINY), "--workers", "2", *bad)
        assert out.returncode != 0 and msg in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_each_pool_runs_at_its_own_power_cap() -> None:
    """A 0.6 cap on the prefill pool slows the prompt by the cap curve's prefill factor; the same
    cap on the decode pool leaves a memory-bound decode step nearly as it was."""
    from powerfleet.sim.profile import CapCurve

    one = [req(0, 1000, 11, (1, 2))]
    base = run(one, Pools(1, 1)).result()
    slow_prefill = run(one, Pools(1, 1, prefill_cap_fraction=0.6)).result()
    slow_decode = run(one, Pools(1, 1, decode_cap_fraction=0.6)).result()
    c = CapCurve()
    assert slow_prefill.first_token_ms[0] - base.first_token_ms[0] == pytest.approx(
        P.prefill_ms(1000) * (1 / c.prefill_throughput(0.6) - 1), rel=1e-9)
    assert slow_decode.first_token_ms[0] - base.first_token_ms[0] == pytest.approx(
        P.decode_ms(1, 1000) * (1 / c.decode_throughput(0.6) - 1), rel=1e-9)
    with pytest.raises(ValueError, match="cap fraction"):
        run(one, Pools(1, 1, decode_cap_fraction=0.05))
