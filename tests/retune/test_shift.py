"""The load-change detector (retune/shift.py) and the live window scored from a change inside it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.retune import live
from powerfleet.retune.shift import ShiftRule, change_inside, detect
from powerfleet.testing.retune_world import start_of, traffic_lines
from tests.retune.conftest import launch_window_k1, retune_config

W = 300.0  # the reference (the window before) and the window, 300 s each
RULE = ShiftRule()


def arrivals(seed: int, pieces: list[tuple[float, float, float, float]]) -> tuple[list[float], list[int]]:
    """Poisson arrivals, piece by piece: (from s, to s, requests/s, mean prompt tokens); the
    prompt lengths are lognormal around the mean (real prompts spread)."""
    rng = np.random.default_rng(seed)
    ts: list[float] = []
    isl: list[int] = []
    for lo, hi, rate, tokens in pieces:
        n = int(rng.poisson(rate * (hi - lo)))
        ts += sorted(float(x) for x in rng.uniform(lo, hi, n))
        isl += [max(1, int(x)) for x in rng.lognormal(np.log(tokens), 0.6, n)]
    return ts, isl


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rate=st.floats(0.2, 30.0), tokens=st.floats(200.0, 8000.0),
       upto=st.sampled_from([60.0, 120.0, 180.0, 300.0]))
def test_steady_traffic_is_not_a_change(seed: int, rate: float, tokens: float, upto: float) -> None:
    ts, isl = arrivals(seed, [(-W, upto, rate, tokens)])
    assert detect(ts, isl, -W, upto, 0.0, RULE) is None


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rate=st.floats(8.0, 30.0), step=st.floats(0.0, 140.0),
       change=st.sampled_from([("requests", 0.5), ("requests", 1.5), ("requests", 2.0), ("requests", 0.33),
                               ("prompt tokens", 0.5), ("prompt tokens", 2.0), ("prompt tokens", 0.33)]))
def test_a_clear_step_is_found_where_it_happened(seed: int, rate: float, step: float,
                                                 change: tuple[str, float]) -> None:
    """A step of the rate by half up or down (or of the prompt length by half down or double),
    150 s of it at 8 req/s or more: found, at the step (three bins either side), in the right
    direction. Power and precision fall with the rate: at 3 req/s a rise by half over 150 s
    gives t about 7 on average, and the step is placed less precisely (bench/retune_shift.py
    shows it on the conversation trace's bursty traffic at about 3 req/s). 2,500 random steps
    of this test's kind were all found and placed within 30 s; 2,500 steady spans gave no
    change."""
    what, factor = change
    end = step + 150.0
    before = (rate, 1000.0)
    after = (rate * factor, 1000.0) if what == "requests" else (rate, 1000.0 * factor)
    ts, isl = arrivals(seed, [(-W, step, *before), (step, end, *after)])
    got = detect(ts, isl, -W, end, 0.0, RULE)
    assert got is not None
    assert abs(got.at_s - step) <= 3 * RULE.bin_s, got
    assert (got.ratio > 1) == (factor > 1), got


def test_change_inside_scores_only_a_change_after_the_start_with_enough_requests() -> None:
    ts, isl = arrivals(1, [(-W, 100.0, 5.0, 1000.0), (100.0, W, 10.0, 1000.0)])
    got = change_inside(ts, isl, 0.0, W, W, RULE, 200)
    assert got is not None and got.at_s == 100.0 and got.series == "requests"
    assert change_inside(ts, isl, 0.0, W, W, None, 200) is None  # the detector switched off
    assert change_inside(ts, isl, 0.0, W, W, RULE, 5000) is None  # too few requests since it to decide
    on_boundary = arrivals(1, [(-W, 0.0, 5.0, 1000.0), (0.0, W, 10.0, 1000.0)])
    assert change_inside(*on_boundary, 0.0, W, W, RULE, 200) is None  # nothing to cut off: the whole window


def test_a_bad_rule_or_input_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="min_ratio"):
        detect([], [], 0.0, 10.0, 0.0, ShiftRule(min_ratio=1.0))
    with pytest.raises(ValueError, match="same length"):
        detect([1.0], [], 0.0, 10.0, 0.0, RULE)
    assert detect([], [], 0.0, 60.0, 0.0, RULE) is None  # shorter than two sides of min_bins


K = 29_000_700


def test_the_live_window_is_scored_from_a_load_change_inside_it(world, kube, redis_url) -> None:
    """Window K+1 quadruples its rate 20 s in: every shard scores from there (the 60 s warm-up
    and the window's first 20 s are replayed unscored), and the sweep record says why."""
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    lines = (traffic_lines(60, start_of(K), 60.0, seed=3) + traffic_lines(20, start_of(K + 1), 20.0, seed=5)
             + traffic_lines(160, start_of(K + 1) + 20, 40.0, seed=6))
    ports, out = launch_window_k1(world, kube, redis_url, cfg, K, lines)
    assert out["status"] == "launched" and out["scored_from"] == start_of(K + 1) + 20, out
    assert out["shift"].startswith("requests rate x4.00") or out["shift"].startswith("prompt tokens rate x4"), out
    assert out["shift"].endswith("20 s into the window"), out
    specs = [kw["spec"] for kw in ports.send.of(live.SHARD_TASK)]
    assert specs and {s["start_s"] for s in specs} == {80.0}  # from the file's first record (window K's start)
    rec = ports.fanin.sweep(out["sid"])
    assert rec is not None and rec.extra["scored_from"] == start_of(K + 1) + 20


def test_retune_sweep_scores_from_a_change_inside_the_window_as_the_live_step(tmp_path) -> None:
    """`powerfleet retune sweep --window` finds the change the live window step would, and
    scores from it; `--shift-z 0` scores the whole window."""
    import json

    from typer.testing import CliRunner

    from powerfleet.cli.main import app

    ts, isl = arrivals(5, [(0.0, 210.0, 8.0, 1000.0), (210.0, 300.0, 16.0, 1000.0)])
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": round(t * 1000.0, 3), "input_length": n, "output_length": 20,
                                         "hash_ids": list(range(i % 7 * 100, i % 7 * 100 + max(1, n // 512)))}) + "\n"
                             for i, (t, n) in enumerate(zip(ts, isl))))
    (tmp_path / "g.json").write_text(json.dumps({"temperature": {"choices": [0.0, 1.0]}}))
    args = ["retune", "sweep", "--trace", str(trace), "--workers", "2", "--objective", "ttft", "--current", "{}",
            "--grid", str(tmp_path / "g.json"), "--window", "150:300", "--no-search", "--processes", "1",
            "--min-requests", "200", "--json"]
    got = json.loads(CliRunner().invoke(app, args).stdout)
    assert got["scored_from_s"] == 210.0 and got["shift"].startswith("requests rate x"), got["shift"]
    assert got["warmup_s"] == 210.0  # everything before the change, back to the window's usual warm-up
    whole = json.loads(CliRunner().invoke(app, [*args, "--shift-z", "0"]).stdout)
    assert whole["scored_from_s"] is None and whole["shift"] is None and whole["warmup_s"] == 150.0
    assert got["probe"]["score"] != whole["probe"]["score"]
