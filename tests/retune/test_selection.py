"""Selection-corrected decisions (issue 33 item 2): the live grid's 108 candidates cannot
turn per-batch noise into a move, and a real 5 % gain still moves.

The noise model is the review's: 16 paired batches; each candidate's per-batch difference
with the probe is independent noise of 2, 3 or 4 % of the probe's score (plus, for the
alternative, one candidate 5 % better). Seeded; bench/retune_selection.py runs it longer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from powerfleet.retune.decision import Candidate, decide
from powerfleet.retune.guard import NoiseGuard
from powerfleet.retune.selection import maxt_confidence

LIVE = NoiseGuard()  # the live defaults: 200 requests, 0.95 (the dwell is the test's own)
GRID = 108
BATCHES = 16


def window(rng: random.Random, noise: float, gain: float, grid: int = GRID) -> tuple[list[Candidate], Candidate]:
    """One window's sweep on mean TTFT (lower is better); candidate 0 carries ``gain``."""
    load = [1000.0 * (1 + rng.uniform(-0.5, 0.5)) for _ in range(BATCHES)]
    probe = Candidate(params={"i": -1.0}, score=sum(load) / BATCHES, batches=load, requests=400)
    cands = []
    for i in range(grid):
        b = [x * (1 - (gain if i == 0 else 0.0) - rng.gauss(0, noise)) for x in load]
        cands.append(Candidate(params={"i": float(i)}, score=sum(b) / BATCHES, batches=b, requests=400))
    return cands, probe


def test_the_live_grid_applies_in_at_most_5_percent_of_null_windows_and_a_5_percent_gain_in_80() -> None:
    rng = random.Random(33)
    null = {s: 0 for s in (0.02, 0.03, 0.04)}
    power = {s: 0 for s in (0.02, 0.03, 0.04)}
    wrong = 0
    n_null, n_alt = 100, 40
    for s in null:
        for _ in range(n_null):
            null[s] += decide(*window(rng, s, 0.0), "ttft", 1.0, guard=LIVE).action == "apply"
        for _ in range(n_alt):
            d = decide(*window(rng, s, 0.05), "ttft", 1.0, guard=LIVE)
            power[s] += d.action == "apply"
            wrong += d.action == "apply" and d.params != {"i": 0.0}
    # At a true 5 %, 300 null windows apply 15 on average (sd 3.8); more than 24 (8 %) happens
    # with probability 1 %. The uncorrected rule applied in 87-94 % (bench/retune_selection.py:
    # 2.3-5.1 % corrected over 1,000 windows a row).
    assert sum(null.values()) <= 24, null
    assert all(v >= 0.8 * n_alt for v in power.values()) and wrong <= 2, (power, wrong)


def test_one_candidate_keeps_its_paired_test_and_the_choice_costs_confidence() -> None:
    rng = random.Random(7)
    cands, probe = window(rng, 0.03, 0.05)
    alone = decide(cands[:1], probe, "ttft", 1.0, guard=LIVE)
    among = decide(cands, probe, "ttft", 1.0, guard=LIVE)
    assert alone.action == "apply" and alone.confidence is not None, alone.reason
    assert among.confidence is not None and among.confidence <= alone.confidence, (alone.confidence, among.confidence)
    # The uncorrected winner of a null grid looks confident; corrected, it does not.
    rng = random.Random(8)
    cands, probe = window(rng, 0.03, 0.0)
    confs = maxt_confidence([c.batches for c in cands], probe.batches, maximize=False)
    best = max(range(GRID), key=lambda i: -float(cands[i].score))  # type: ignore[arg-type]
    solo = maxt_confidence([cands[best].batches], probe.batches, maximize=False)[0]
    assert solo is not None and confs[best] is not None and confs[best] < 0.95 < solo, (solo, confs[best])


@pytest.mark.parametrize("dwell", [3, 0])  # 20 s windows hold a knob 3 windows, 300 s ones none
def test_noise_windows_through_the_guard_rarely_move_a_knob(dwell: int) -> None:
    """A run of null windows on a two-knob grid at 4 % noise (what short windows look like),
    through the live guard and the dwell as the harvest applies them: a handful of moves at
    most, where the uncorrected rule moved in most windows; the max-t rule alone bounds it
    (dwell 0), and the dwell only holds a knob that did move."""
    from powerfleet.retune.guard import Move, dwell_blocks

    rng = random.Random(20)
    current = {"a": 1.0, "b": 1.0}
    moves: dict[str, Move] = {}
    applied = 0
    for k in range(60):
        load = [1000.0 * (1 + rng.uniform(-0.5, 0.5)) for _ in range(BATCHES)]
        probe = Candidate(params=dict(current), score=sum(load) / BATCHES, batches=load, requests=250)
        cands = []
        for a in (0.5, 1.0, 2.0, 4.0):
            for b in (0.5, 1.0, 2.0):
                bs = [x * (1 - rng.gauss(0, 0.04)) for x in load]
                cands.append(Candidate(params={"a": a, "b": b}, score=sum(bs) / BATCHES, batches=bs, requests=250))
        d = decide(cands, probe, "ttft", 1.0, guard=LIVE)
        if d.action == "apply" and dwell_blocks(moves, current, d.params, k, dwell) is None:
            applied += 1
            moves.update({p: Move(k, current[p]) for p, v in d.params.items() if v != current[p]})
            current = dict(d.params)
    assert applied <= 6, applied  # 60 windows at <= 5 %: a handful at most, each held for the dwell


def test_a_wide_spread_gain_beside_near_ties_passes_the_corrected_test() -> None:
    """Issue 33 item 6: the synthetic construction's window 1 (the sweep stored as it ran).
    8/8/0 is 11.0 % better than the default with batch differences spread 11.8 % (queueing
    near capacity) beside candidates that nearly tie the probe; the moderated t alone gave it
    0.932 and the loop stayed on the default a window longer, 5.4 % behind the setting chosen
    once. The larger of the moderated and the plain t passes it."""
    data = json.loads((Path(__file__).parent / "data" / "synthetic_window1_sweep.json").read_text())
    probe = Candidate(**data["probe"])
    cands = [Candidate(**c) for c in data["candidates"]]
    d = decide(cands, probe, "ttft", 1.0, guard=LIVE)
    assert d.action == "apply" and d.params["prefill_load_scale"] == 8.0, d.reason
    assert d.confidence is not None and d.confidence >= 0.95 and d.improvement_pct > 10, d.reason
