"""The noise guard: minimum traffic, a paired test on CRN batches, dwell (issue 20 item 5)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.config.retune import RetuneConfig
from powerfleet.retune.decision import Candidate, decide
from powerfleet.retune.guard import Move, NoiseGuard, dwell_blocks
from powerfleet.retune.grid import DEFAULT_GRID
from powerfleet.retune.settings import resolve
from powerfleet.retune.sweep import run_sweep
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.trace import TraceRequest

GUARD = NoiseGuard(min_requests=100, confidence=0.95, dwell_windows=3)


def _cand(params: dict[str, float], batches: list[float], requests: int = 400) -> Candidate:
    return Candidate(params=params, score=sum(batches) / len(batches), batches=batches, requests=requests)


def test_a_consistent_gain_applies_and_a_gain_carried_by_one_batch_does_not() -> None:
    probe = _cand({"t": 1.0}, [1000.0] * 16)
    steady = _cand({"t": 0.0}, [960.0 + (i % 3) for i in range(16)])  # better in every batch
    lucky = _cand({"t": 0.0}, [1000.0 + (5 if i % 2 else -5) for i in range(15)] + [400.0])  # one batch
    assert decide([steady], probe, "ttft", 1.0, guard=GUARD).action == "apply"
    d = decide([lucky], probe, "ttft", 1.0, guard=GUARD)
    assert lucky.score < probe.score * 0.97  # the mean alone would apply
    assert d.action == "keep" and "confidence" in d.reason and d.confidence is not None and d.confidence < 0.95
    assert decide([lucky], probe, "ttft", 1.0).action == "apply"  # without the guard: noise decides


def test_too_few_requests_keep_and_the_decision_shows_margin_confidence_and_count() -> None:
    probe = _cand({"t": 1.0}, [1000.0] * 16, requests=60)
    best = _cand({"t": 0.0}, [900.0 + (i % 2) for i in range(16)], requests=60)
    second = _cand({"t": 0.5}, [950.0] * 16, requests=60)
    d = decide([second, best], probe, "ttft", 1.0, guard=GUARD)
    assert d.action == "keep" and "only 60 requests" in d.reason
    assert d.requests == 60 and d.runner_up_margin_pct is not None and abs(d.runner_up_margin_pct - 4.95) < 0.01
    assert d.confidence is not None and d.confidence > 0.99


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batches=st.integers(8, 32), spread=st.floats(0.01, 0.5),
       base=st.floats(100.0, 5000.0))
def test_candidate_and_probe_from_one_distribution_almost_never_apply(seed, batches, spread, base) -> None:
    rng = random.Random(seed)
    applied = 0
    windows = 200
    for _ in range(windows):
        # Shared per-batch load (what CRN pairs) plus independent noise of the same law for both.
        load = [base * (1 + rng.uniform(-0.5, 0.5)) for _ in range(batches)]
        probe = _cand({"t": 1.0}, [x * (1 + rng.gauss(0, spread)) for x in load])
        cand = _cand({"t": 0.0}, [x * (1 + rng.gauss(0, spread)) for x in load])
        applied += decide([cand], probe, "ttft", 0.0, guard=GUARD).action == "apply"
    # An exact 5 % test (sign flips): 24 of 200 is 3.4 standard deviations above 10 (p < 1e-3 per example).
    assert applied <= windows * 0.12, applied


def test_a_parameter_does_not_move_back_within_the_dwell() -> None:
    moves = {"temperature": Move(window=10, previous=1.0)}  # moved 1.0 -> 0.0 at window 10
    cur = {"temperature": 0.0, "prefill_load_scale": 1.0}
    back = {"temperature": 1.0, "prefill_load_scale": 1.0}
    for k in (11, 12, 13):  # dwell 3: the three windows after the move's own hold it
        assert "moving it back" in (dwell_blocks(moves, cur, back, k, 3) or ""), k
    assert dwell_blocks(moves, cur, back, 14, 3) is None  # the dwell has passed, at the first window it may
    assert dwell_blocks(moves, cur, back, 12, 1) is None and dwell_blocks(moves, cur, back, 11, 1)  # dwell 1
    assert dwell_blocks(moves, cur, {"temperature": 0.0, "prefill_load_scale": 4.0}, 11, 3) is None  # another knob
    assert dwell_blocks(moves, cur, {"temperature": -1.0, "prefill_load_scale": 1.0}, 11, 3) is None  # same way


def test_the_dwell_is_a_time_so_short_windows_hold_a_knob_longer_than_long_ones() -> None:
    """``retune.dwell_s`` (60 s) in whole windows: a 20 s window says little alone, so a knob
    it moved is held for three of them; a 300 s window is not held (docs/retune.md)."""
    for interval, windows in ((10, 6), (20, 3), (30, 2), (60, 1), (150, 0), (300, 0)):
        cfg = RetuneConfig(deployments=["d"], window_interval_s=interval, time_budget_s=interval - 1,
                           shard_timeout_s=interval - 2)
        assert resolve(cfg, "d").guard.dwell_windows == windows, interval
    slow = RetuneConfig(deployments=["d"], dwell_s=900, per_deployment={"e": {"dwell_s": 0}})
    assert resolve(slow, "d").guard.dwell_windows == 3 and resolve(slow, "e").guard.dwell_windows == 0
    assert resolve(slow, "d").generation != resolve(RetuneConfig(deployments=["d"]), "d").generation


def test_without_a_paired_confidence_a_move_never_passes_on_the_mean_alone() -> None:
    """Issue 37 finding 4: no batch scores, or fewer than three complete pairs: keep."""
    probe = _cand({"t": 1.0}, [1000.0] * 16)
    for cand_batches, probe_batches in ((None, probe.batches), ([800.0, 800.0], [1000.0, 1000.0]),
                                        ([800.0, None, 800.0, None], [1000.0, 1000.0, None, 1000.0]),
                                        ([800.0] * 16, None)):
        far = Candidate(params={"t": 0.0}, score=800.0, batches=cand_batches, requests=400)  # 20 % on the mean
        p = probe.model_copy(update={"batches": probe_batches})
        d = decide([far], p, "ttft", 1.0, guard=GUARD)
        assert d.action == "keep" and "no paired confidence" in d.reason and d.confidence is None, d.reason
        assert decide([far], p, "ttft", 1.0).action == "apply"  # without the guard the mean decides


def test_the_sweep_reports_confidence_and_requests_from_crn_batches() -> None:
    reqs = [TraceRequest(timestamp_ms=i * 250.0, input_length=512 * (20 + i % 7), output_length=8,
                         hash_ids=tuple(range((i % 5) * 100, (i % 5) * 100 + 20 + i % 7))) for i in range(320)]
    res = run_sweep(reqs, 4, "ttft", RouterPolicy(temperature=1.0), DEFAULT_GRID.model_copy(update={
        "overlap_score_credit": None, "prefill_load_scale": None}), processes=1, window=(0.0, None))
    assert res.probe.requests == 320 and res.probe.batches is not None and len(res.probe.batches) == 16
    assert res.decision.requests == 320 and res.decision.confidence is not None
