"""Ties never move, and a sweep does not replay axes that cannot change the outcome.

A disaggregated prefill router has no active-block term, so while the active-request weight is
0 its cost is ``prefill_load_scale * adj``: the scale changes no pick, a disaggregated sweep
replayed each candidate six times, and the tied copies made a "move" (scale 1 -> 0.25) that
changed nothing (issue 20, follow-up of item 4)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.retune.decision import Candidate, decide
from powerfleet.retune.grid import DEFAULT_GRID, SweepGrid
from powerfleet.retune.guard import OFF, NoiseGuard
from powerfleet.retune.sweep import run_sweep
from powerfleet.sim.disagg import Pools, replay_batches
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.replay import prepare
from powerfleet.sim.trace import TraceRequest

SEARCHED = ("overlap_score_credit", "prefill_load_scale", "temperature")


def _cand(params: dict[str, float], score: float, n: int = 8) -> Candidate:
    return Candidate(params=RouterPolicy(**params).model_dump(), score=score, batches=[score] * n, requests=400)


def _reqs(n: int = 160) -> list[TraceRequest]:
    return [TraceRequest(timestamp_ms=i * 180.0, input_length=512 * (8 + i % 7), output_length=6,
                         hash_ids=tuple(range((i % 5) * 100, (i % 5) * 100 + 8 + i % 7))) for i in range(n)]


def test_a_tie_with_the_best_keeps_the_current_value_of_a_parameter_that_changes_nothing() -> None:
    # grid order puts the scale-0.25 copy first; it scores exactly as the scale-1 copy
    probe = _cand({"overlap_score_credit": 0.0}, 100.0)
    tied = [_cand({"overlap_score_credit": 0.8, "prefill_load_scale": s}, 90.0) for s in (0.25, 0.5, 1.0, 2.0)]
    d = decide([*tied, _cand({"overlap_score_credit": 0.4}, 95.0)], probe, "ttft", 1.0, guard=OFF)
    assert d.action == "apply"
    assert (d.params["overlap_score_credit"], d.params["prefill_load_scale"]) == (0.8, 1.0)
    assert d.ranked[0].params == d.params and d.best is not None and d.best.params == d.params
    assert d.runner_up_margin_pct == 0.0  # the runner-up is a tied copy


@settings(max_examples=40, deadline=None)
@given(score=st.floats(1.0, 1e5), noise=st.sampled_from([0.0, 1e-13, -1e-13, 1e-11]),
       guard=st.sampled_from([OFF, NoiseGuard(min_requests=0)]))
def test_a_candidate_tied_with_the_probe_never_moves(score: float, noise: float, guard: NoiseGuard) -> None:
    probe = _cand({}, score)
    cands = [_cand({"prefill_load_scale": s, "temperature": t}, score * (1 - noise)) for s in (0.25, 1.0, 8.0)
             for t in (0.0, 1.0)]
    d = decide(cands, probe, "ttft", 0.0, guard=guard)
    assert d.action == "keep" and d.params == probe.params, d.reason


@settings(max_examples=25, deadline=None)
@given(credit=st.sampled_from([0.0, 0.5, 1.0, 8.0]), scale=st.sampled_from([0.0, 0.25, 1.0, 3.0]),
       temp=st.sampled_from([0.0, 0.5]), weight=st.sampled_from([0.0, 0.0, 1.0]),
       decay=st.sampled_from([0.0, 0.5]))
def test_the_scale_is_held_exactly_when_the_cost_has_nothing_beside_it(credit: float, scale: float, temp: float,
                                                                      weight: float, decay: float) -> None:
    cur = RouterPolicy(overlap_score_credit=credit, prefill_load_scale=scale, temperature=temp,
                       decode_active_request_weight=weight, overlap_score_credit_decay=decay)
    held = DEFAULT_GRID.held_knobs(cur, disaggregated=True)
    assert held == (["prefill_load_scale"] if weight == 0 and scale > 0 else [])
    # aggregated: the active-block term is always beside it, nothing is held, the grid is the grid
    assert DEFAULT_GRID.held_knobs(cur, disaggregated=False) == []
    assert DEFAULT_GRID.for_deployment(cur, disaggregated=False) is DEFAULT_GRID


def test_a_held_scale_replays_identically_in_the_disaggregated_model() -> None:
    # the rule read from the cost code, checked against the replay itself
    arr = prepare(_reqs(), seed=0)
    base = RouterPolicy(overlap_score_credit=0.6, temperature=0.5)
    def outcome(pol: RouterPolicy) -> list[dict[str, object]]:
        whole, parts = replay_batches(arr, Pools(2, 2), pol, 0, batches=4)
        return [x.model_dump(exclude={"policy"}) for x in (whole, *parts)]

    one = outcome(base)
    assert one[0]["requests"] == 160
    for s in (0.25, 8.0):
        assert outcome(base.model_copy(update={"prefill_load_scale": s})) == one
    weighted = base.model_copy(update={"decode_active_request_weight": 1.0})
    assert DEFAULT_GRID.held_knobs(weighted, disaggregated=True) == []


def _only_differ_in(a: dict[str, float], b: dict[str, float], knob: str) -> bool:
    return a != b and all(a[k] == b[k] for k in a if k != knob)


def test_a_disaggregated_sweep_replays_only_distinct_candidates_and_an_aggregated_one_is_unchanged() -> None:
    grid = SweepGrid.model_validate({"overlap_score_credit": {"choices": [0.0, 1.0]},
                                     "prefill_load_scale": {"choices": [0.25, 1.0, 4.0]},
                                     "temperature": {"choices": [0.0]}})
    cur = RouterPolicy()
    kw = dict(processes=1, window=(0.0, None), guard=OFF, min_improvement_pct=0.0)
    dis = run_sweep(_reqs(), Pools(2, 2), "ttft", cur, grid, **kw)
    params = [c.params for c in dis.candidates]
    assert dis.held_knobs == ["prefill_load_scale"] and dis.grid_points == 2
    assert not any(_only_differ_in(a, b, "prefill_load_scale") for a in params for b in params)
    assert {p["prefill_load_scale"] for p in params} == {1.0}
    assert dis.decision.params["prefill_load_scale"] == 1.0
    agg = run_sweep(_reqs(), 2, "ttft", cur, grid, **kw)
    assert agg.held_knobs == [] and agg.grid_points == 6
    assert [c.params for c in agg.candidates][:6] == [p.model_dump() for p in grid.points(cur)]
