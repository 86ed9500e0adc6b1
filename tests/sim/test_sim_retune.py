"""Sweep core: grid, shard split, objectives, decision rule (pure)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.retune.decision import Candidate, decide
from powerfleet.retune.grid import (
    DEFAULT_GRID, EdgeSearch, KnobSpec, SweepGrid, load_grid, parse_grid, search_beyond, split_shards,
)
from powerfleet.retune.objectives import DIRECTION, MAXIMIZE, Objective, parse_objective, score
from powerfleet.retune.sweep import run_shard, run_sweep
from powerfleet.sim.policy import SLA, RouterPolicy
from powerfleet.sim.replay import prepare, replay


def test_default_grid_has_108_valid_points_in_a_fixed_order() -> None:
    pts = DEFAULT_GRID.points(RouterPolicy(decode_active_request_weight=3))
    assert len(pts) == 108 and len({p.model_dump_json() for p in pts}) == 108
    assert all(p.decode_active_request_weight == 3 for p in pts)
    assert (pts[0].overlap_score_credit, pts[0].prefill_load_scale, pts[0].temperature) == (0.0, 0.25, 0.0)
    assert (pts[1].overlap_score_credit, pts[1].prefill_load_scale, pts[1].temperature) == (0.0, 0.25, 0.5)
    assert load_grid("default") is DEFAULT_GRID


def test_grid_ranges_and_missing_knobs() -> None:
    g = parse_grid({"prefill_load_scale": {"range": {"min": 0.5, "max": 2.0, "step": 0.5}}})
    pts = g.points(RouterPolicy(temperature=0.3))
    assert [p.prefill_load_scale for p in pts] == [0.5, 1.0, 1.5, 2.0]
    assert {p.temperature for p in pts} == {0.3}
    with pytest.raises(ValueError, match="overlap_score_credit"):
        SweepGrid(overlap_score_credit=KnobSpec(choices=[0.5, -2.0])).points(RouterPolicy())
    with pytest.raises(ValueError, match="exactly one"):
        parse_grid({"temperature": {}})
    with pytest.raises(ValueError, match="extra|not permitted"):
        parse_grid({"bogus": {"choices": [1]}})


def test_default_grid_splits_into_three_shards_of_36() -> None:
    shards = split_shards(DEFAULT_GRID.points(RouterPolicy()), 3)
    assert [len(s) for s in shards] == [36, 36, 36]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), k=st.integers(1, 40))
def test_shard_split_covers_every_point_exactly_once(n: int, k: int) -> None:
    pts = list(range(n))
    shards = split_shards(pts, k)
    assert [p for s in shards for p in s] == pts
    assert len(shards) == min(k, n)
    if shards:
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert split_shards(pts, k) == shards


def _summary(**kw):
    reqs = kw.pop("reqs", None)
    from powerfleet.sim.trace import TraceRequest

    reqs = reqs if reqs is not None else [TraceRequest(float(i * 100), 600, 20, (i,)) for i in range(5)]
    return replay(reqs, 2, **kw)


def test_objectives_score_the_summary_figures_and_fail_with_reasons() -> None:
    s = _summary(sla=SLA(ttft_ms=10_000, itl_ms=1_000))
    assert score(s, "throughput").score == s.throughput_tok_s
    assert score(s, "throughputPerGpu").score == pytest.approx(s.throughput_tok_s / s.gpus)
    assert score(s, "ttft").score == s.ttft_ms.mean
    assert score(s, "e2eLatency").score == s.e2e_ms.mean
    assert score(s, "goodput").score == s.goodput_req_s
    assert score(s, "goodputPerGpu").score == pytest.approx(s.goodput_req_s / s.gpus)
    assert score(s, "throughputPerUser").score == s.throughput_per_user_tok_s
    no_sla = _summary()
    r = score(no_sla, Objective.goodput)
    assert not r.ok and r.score is None and "SLA" in (r.reason or "")
    from powerfleet.sim.trace import TraceRequest

    one_token = _summary(reqs=[TraceRequest(0.0, 100, 1, (1,))])
    r = score(one_token, "throughputPerUser")
    assert not r.ok and r.reason
    with pytest.raises(ValueError, match="unknown objective"):
        parse_objective("latency")
    assert DIRECTION[Objective.ttft] == "minimize" and DIRECTION[Objective.goodput] == MAXIMIZE


def _cand(score_: float | None, i: int, ok: bool = True) -> Candidate:
    return Candidate(params={"i": i}, score=score_, ok=ok, reason=None if ok else "failed")


def test_decision_applies_only_beyond_the_threshold_and_ties_keep() -> None:
    probe = Candidate(params={"i": -1}, score=100.0)
    d = decide([_cand(104.0, 0), _cand(110.0, 1)], probe, "throughput", 5.0)
    assert d.action == "apply" and d.params == {"i": 1} and d.improvement_pct == pytest.approx(10.0)
    d = decide([_cand(105.0, 0)], probe, "throughput", 5.0)
    assert d.action == "keep" and d.params == {"i": -1}  # exactly 5 % is not "more than"
    d = decide([_cand(100.0, 0)], probe, "throughput", 0.0)
    assert d.action == "keep" and "ties" in d.reason
    d = decide([_cand(90.0, 0), _cand(95.0, 1)], probe, "ttft", 0.0)
    assert d.action == "apply" and d.params == {"i": 0} and d.improvement_pct == pytest.approx(10.0)
    d = decide([_cand(float("nan"), 0), _cand(None, 1, ok=False)], probe, "ttft", 0.0)
    assert d.action == "keep" and "no candidate" in d.reason and len(d.unranked) == 2
    d = decide([_cand(1.0, 0)], Candidate(params={}, score=None, ok=False, reason="no SLA"), "goodput", 0.0)
    assert d.action == "keep" and "probe" in d.reason


finite = st.floats(-1e6, 1e6, allow_nan=False)
maybe = st.one_of(finite, st.just(float("nan")), st.just(float("inf")), st.just(float("-inf")), st.none())


@settings(max_examples=300, deadline=None)
@given(
    scores=st.lists(maybe, max_size=12),
    probe=finite,
    objective=st.sampled_from(list(Objective)),
    pct=st.floats(0, 50),
)
def test_decision_rule_properties(scores, probe, objective, pct) -> None:
    cands = [Candidate(params={"i": i}, score=s, ok=s is not None, reason=None if s is not None else "x")
             for i, s in enumerate(scores)]
    d = decide(cands, Candidate(params={"i": -1}, score=probe), objective, pct)
    sign = 1 if DIRECTION[objective] == MAXIMIZE else -1
    finite_scores = [c.score for c in cands if c.score is not None and math.isfinite(c.score)]
    # every candidate is recorded exactly once
    assert len(d.ranked) + len(d.unranked) == len(cands)
    assert all(math.isfinite(c.score) for c in d.ranked)
    ranked = [sign * c.score for c in d.ranked]
    assert ranked == sorted(ranked, reverse=True)
    if d.action == "apply":
        best = d.ranked[0]
        assert d.params == best.params
        gain = sign * (best.score - probe)
        assert gain > pct / 100 * abs(probe) and gain > 0
    else:
        assert d.params == {"i": -1}
        if finite_scores:
            best = max(sign * s for s in finite_scores)
            assert best - sign * probe <= pct / 100 * abs(probe) or best - sign * probe <= 0


def test_sweep_probe_equals_a_plain_replay_and_shards_match_local_runs(tiny_requests) -> None:
    grid = parse_grid({"overlap_score_credit": {"choices": [0.0, 1.0]}, "temperature": {"choices": [0.0, 0.5]}})
    cur = RouterPolicy(prefill_load_scale=2.0)
    res = run_sweep(tiny_requests, 3, "ttft", cur, grid, max_shards=3, seed=4, window=(0, 20), processes=1)
    plain = replay(tiny_requests, 3, cur, 4, window=(0, 20))
    assert res.probe.score == plain.ttft_ms.mean
    grid_cands = [c for c in res.candidates if c.origin == "grid"]
    assert res.shards == 3 and [c.shard for c in grid_cands] == [0, 0, 1, 2]
    assert res.search_points == len(res.candidates) - 4
    arr = prepare(tiny_requests, seed=4, window=(0, 20))
    again = run_shard(arr, 3, grid.points(cur), 4, "ttft")
    assert [c.score for c in again] == [c.score for c in grid_cands]
    assert len(res.decision.ranked) == len(res.candidates)
    forked = run_sweep(tiny_requests, 3, "ttft", cur, grid, max_shards=3, seed=4, window=(0, 20), processes=2)
    assert forked.to_json_dict() == res.to_json_dict()


def test_shard_entry_from_json_args_matches_the_sweep(tiny_requests) -> None:
    from powerfleet.retune.sweep import run_shard_from_trace

    from .conftest import TINY

    grid = parse_grid({"overlap_score_credit": {"choices": [0.0, 1.0]}})
    res = run_sweep(tiny_requests, 2, "e2eLatency", RouterPolicy(), grid, seed=1, window=(0, 15), processes=1)
    got = run_shard_from_trace(
        str(TINY), 2, [{"overlap_score_credit": 0.0}, {}], objective="e2eLatency", seed=1, window=(0, 15)
    )
    assert [c.score for c in got] == [res.candidates[0].score, res.probe.score]


def test_search_extends_a_knob_whose_optimum_lies_beyond_the_grid() -> None:
    # A known optimum: the score is the squared distance of log2(scale) from log2(32), plus
    # a small credit term; the grid's scales stop at 8.
    grid = parse_grid({"prefill_load_scale": {"choices": [0.25, 1, 4, 8]},
                       "overlap_score_credit": {"choices": [0.5, 1.0]}})
    axes = grid.axes(RouterPolicy())

    def fake(points: list[RouterPolicy]) -> list[Candidate]:
        return [Candidate(params=p.model_dump(), score=(math.log2(p.prefill_load_scale) - 5) ** 2
                          + abs(p.overlap_score_credit - 1)) for p in points]

    cands = fake(grid.points(RouterPolicy()))
    found = search_beyond(axes, cands, "ttft", fake, EdgeSearch(factor=2.0, max_rounds=10))
    assert all(c.origin == "search" for c in found)
    assert [c.params["prefill_load_scale"] for c in found if c.params["overlap_score_credit"] == 1] == [16, 32, 64]
    assert [c.params["overlap_score_credit"] for c in found if c.params["overlap_score_credit"] != 1] == [2.0]
    best = decide(cands + found, cands[0], "ttft")
    assert best.params["prefill_load_scale"] == 32 and best.best.origin == "search"
    # the budget stops it; a best inside the grid starts nothing; refine bisects around it
    assert search_beyond(axes, cands, "ttft", fake, EdgeSearch(), keep_going=lambda: False) == []
    one = parse_grid({"prefill_load_scale": {"choices": [0.25, 1, 4, 8]}})
    inner = [Candidate(params=p.model_dump(), score=abs(p.prefill_load_scale - 4)) for p in one.points(RouterPolicy())]
    axes = one.axes(RouterPolicy())
    assert search_beyond(axes, inner, "ttft", fake, EdgeSearch(max_rounds=3)) == []
    refined = search_beyond(axes, inner, "ttft", fake, EdgeSearch(max_rounds=1, refine=True))
    assert sorted(c.params["prefill_load_scale"] for c in refined) == [2.0, pytest.approx(32 ** 0.5)]


def test_sweep_reports_grid_and_search_points_and_warm_starts(tiny_requests) -> None:
    grid = parse_grid({"prefill_load_scale": {"choices": [0.0, 1.0]}, "temperature": {"choices": [0.0, 1.0]}})
    res = run_sweep(tiny_requests, 3, "ttft", RouterPolicy(), grid, seed=2, window=(10, 20), processes=1)
    assert res.warmup_s == 10 and res.grid_points == 4
    assert [c.origin for c in res.candidates[:4]] == ["grid"] * 4
    assert all(c.origin == "search" for c in res.candidates[4:]) and res.search_points == len(res.candidates) - 4
    off = run_sweep(tiny_requests, 3, "ttft", RouterPolicy(), grid, seed=2, window=(10, 20), processes=1,
                    search=EdgeSearch(enabled=False), warmup_s=0)
    assert off.search_points == 0 and off.warmup_s == 0 and len(off.candidates) == 4
    assert off.probe.score == replay(tiny_requests, 3, RouterPolicy(), 2, window=(10, 20), warmup_s=0).ttft_ms.mean
    assert res.probe.score == replay(tiny_requests, 3, RouterPolicy(), 2, window=(10, 20)).ttft_ms.mean


def test_shard_entry_warm_started_by_the_current_settings_matches_the_sweep(tiny_requests) -> None:
    from powerfleet.retune.sweep import run_shard_from_trace

    from .conftest import TINY

    grid = parse_grid({"overlap_score_credit": {"choices": [0.0, 1.0]}})
    cur = RouterPolicy(temperature=0.5)
    res = run_sweep(tiny_requests, 2, "ttft", cur, grid, seed=1, window=(10, 20), processes=1,
                    search=EdgeSearch(enabled=False))
    got = run_shard_from_trace(str(TINY), 2, [{"overlap_score_credit": 0.0, "temperature": 0.5}], objective="ttft",
                               seed=1, window=(10, 20), warmup_policy=cur.model_dump())
    assert got[0].score == res.candidates[0].score
    own = run_shard_from_trace(str(TINY), 2, [{"overlap_score_credit": 0.0, "temperature": 0.5}], objective="ttft",
                               seed=1, window=(10, 20))  # warm-up under the point's own settings
    assert own[0].score != got[0].score


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".json", ".yaml", ".yml", ""]))
def test_grid_files_of_any_bytes_load_or_fail_in_one_line(tmp_path_factory, data: bytes, suffix: str) -> None:
    p = tmp_path_factory.mktemp("g") / f"grid{suffix}"
    p.write_bytes(data)
    try:
        load_grid(p)
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc)


def test_sweep_starts_no_search_round_once_its_budget_is_spent(tiny_requests) -> None:
    grid = parse_grid({"prefill_load_scale": {"choices": [0.0, 1.0]}, "temperature": {"choices": [0.0, 1.0]}})
    ticks = iter(range(0, 10_000, 100))  # an injected clock: 100 s pass between readings
    res = run_sweep(tiny_requests, 3, "ttft", RouterPolicy(), grid, seed=2, window=(10, 20), processes=1,
                    budget_s=50, clock=lambda: float(next(ticks)))
    assert res.search_points == 0 and len(res.candidates) == 4
    free = run_sweep(tiny_requests, 3, "ttft", RouterPolicy(), grid, seed=2, window=(10, 20), processes=1)
    assert free.search_points > 0


def test_a_decisions_reason_names_the_objectives_unit() -> None:
    """A score without its unit reads as a bare number ("best 3323.31 vs probe 3528.13")."""
    from powerfleet.retune.decision import Candidate, decide

    probe = Candidate(params={"temperature": 1.0}, score=120.0)
    best = Candidate(params={"temperature": 0.0}, score=100.0)
    d = decide([best], probe, "ttft")
    assert "best 100 vs probe 120 ms (mean TTFT) (minimize)" in d.reason, d.reason
