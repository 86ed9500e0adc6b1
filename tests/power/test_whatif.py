"""The what-if (power/whatif.py, power/report.py, `powerfleet power whatif`) and its parsers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.power.guard import GuardSettings
from powerfleet.power.inputs import parse_sla_pairs, parse_span
from powerfleet.power.overlay import GRACE
from powerfleet.power.report import report
from powerfleet.power.whatif import WhatIfConfig, run_whatif, split
from powerfleet.sim.policy import SLA
from powerfleet.sim.power import replay_power
from powerfleet.sim.replay import prepare
from powerfleet.sim.trace import TraceRequest, read_trace

DATA = Path(__file__).resolve().parents[1] / "sim" / "data"
SLICE = DATA / "conversation_0_180.jsonl.gz"
EXE = Path(sys.executable).parent / "powerfleet"
CAP_SUM = 8 * 4 * 700.0
LIMIT = CAP_SUM / 1.3  # 8 workers of 4 GPUs, oversubscribed 1.3x


@pytest.fixture(scope="module")
def arrivals():  # at 1.2x the slice's rate, unguarded, the group stays above the limit for 8 s at a time
    return prepare(read_trace(SLICE).requests, warmup_s=0.0, speedup=1.2)


@pytest.fixture(scope="module")
def oversubscribed(arrivals):
    cfg = WhatIfConfig(workers=8, gpus_per_worker=4, cap_w=700.0, limit_w=LIMIT, sla=SLA(ttft_ms=3000, itl_ms=60),
                       telemetry_loss=(60.0, 80.0), load_scale=1.2)
    return run_whatif(arrivals, cfg)


def _runs_above(series: list[float], limit: float) -> int:
    longest = run = 0
    for w in series:
        run = run + 1 if w > limit else 0
        longest = max(longest, run)
    return longest


def test_the_guard_keeps_every_excursion_within_two_periods(arrivals, oversubscribed) -> None:
    # unguarded, the same GPUs stay above the limit for longer than two periods
    _, free = replay_power(arrivals, 8)
    assert _runs_above(free.group_w(), LIMIT) > 2
    rep = report(oversubscribed)
    assert rep.guard["active"] and rep.excursions.longest_s <= 2
    assert _runs_above(oversubscribed.timeline.group_w, LIMIT) == rep.excursions.longest_s
    assert rep.draw_w.max is not None and rep.draw_w.max <= rep.requested_w


def test_a_telemetry_loss_moves_every_gpu_to_its_safe_cap_within_one_period(oversubscribed) -> None:
    rep = report(oversubscribed)
    assert rep.fallback.activations == 8
    assert rep.fallback.longest_reaction_s is not None and rep.fallback.longest_reaction_s <= 1.0
    # from the first whole second under safe caps to the loss' end, the group is under its limit
    assert max(oversubscribed.timeline.group_w[61:80]) <= LIMIT
    assert rep.guard["modes"]["fallback"] == 20


def test_low_priority_is_throttled_more_than_high(oversubscribed) -> None:
    rep = report(oversubscribed)
    low, high = rep.by_priority["low"], rep.by_priority["high"]
    assert low.throttle_events > high.throttle_events
    assert low.capped_gpu_time_fraction > high.capped_gpu_time_fraction
    assert low.requests + high.requests == rep.requests == 556


def test_a_group_whose_caps_fit_its_limit_is_not_guarded(arrivals) -> None:
    cfg = WhatIfConfig(workers=8, gpus_per_worker=4, cap_w=700.0, limit_w=CAP_SUM)
    rep = report(run_whatif(arrivals, cfg))
    assert not rep.guard["active"] and rep.capped.gpu_time_fraction == 0.0 and rep.guard["modes"] == {}


def test_the_priority_split_shares_workers_and_traffic(arrivals) -> None:
    parts = split(arrivals, 0.25)
    assert len(parts["low"].arrival_ms) + len(parts["high"].arrival_ms) == len(arrivals.arrival_ms)
    assert abs(len(parts["low"].arrival_ms) / len(arrivals.arrival_ms) - 0.25) < 0.02
    assert WhatIfConfig(workers=8, gpus_per_worker=4, cap_w=700, limit_w=1e4, priority_split=0.25).split_workers() \
        == {"high": 6, "low": 2}
    assert WhatIfConfig(workers=3, gpus_per_worker=1, cap_w=700, limit_w=1e4, priority_split=0.01).split_workers() \
        == {"high": 2, "low": 1}


def test_json_contract_through_the_console_script_is_byte_identical() -> None:
    if not EXE.exists():
        pytest.skip("powerfleet console script not installed next to the interpreter")
    args = [str(EXE), "power", "whatif", "--trace", str(SLICE), "--window", "0:60", "--workers", "4",
            "--gpus-per-worker", "4", "--cap-w", "700", "--limit-w", "8600", "--sla", "ttft_ms=3000,itl_ms=60",
            "--telemetry-loss", "20:30", "--json"]
    a = subprocess.run(args, capture_output=True, text=True, timeout=120)
    b = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    d = json.loads(a.stdout)
    assert d["schema"] == "powerfleet.power.whatif/v1"
    assert {"workers", "gpus", "limit_w", "requested_w", "goodput_rps", "ttft_ms", "itl_ms", "by_priority", "draw_w",
            "excursions", "capped", "fallback", "guard"} <= set(d)
    assert set(d["by_priority"]) == {"high", "low"} and set(d["ttft_ms"]) == {"p50", "p99"}
    assert set(d["draw_w"]) == {"mean", "p99", "max"}
    assert set(d["excursions"]) == {"count", "longest_s", "max_over_w"}
    assert set(d["capped"]) == {"gpu_time_fraction", "events_per_gpu_hour"}
    assert set(d["fallback"]) == {"activations", "longest_reaction_s"}
    assert d["requested_w"] == 16 * 700 and d["gpus"] == 16
    human = subprocess.run(args[:-1], capture_output=True, text=True, timeout=120)
    assert human.returncode == 0 and "excursions over the limit" in human.stdout


@pytest.mark.parametrize("args, needle", [
    (["--limit-w", "500"], "oversubscription refused"),
    (["--sla", "ttft_ms"], "--sla must be KEY=VALUE"),
    (["--sla", "ttft_ms=2000"], "--sla"),
    (["--telemetry-loss", "9:3"], "--telemetry-loss"),
    (["--guard", '{"release": 0.99}'], "--guard"),
    (["--cap-w", "900"], "card's range"),
    (["--workers", "0"], "--workers"),
    (["--priority-split", "1.5"], "--priority-split"),
    (["--window", "900:990"], "no request"),
])
def test_bad_input_is_one_line_exit_2(args, needle) -> None:
    from typer.testing import CliRunner

    from powerfleet.cli.main import app

    base = {"--trace": str(SLICE), "--workers": "2", "--gpus-per-worker": "4", "--cap-w": "700", "--limit-w": "5000"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    flat = [x for kv in base.items() for x in kv]
    r = CliRunner().invoke(app, ["power", "whatif", *flat])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("powerfleet: error: ") and needle in lines[0], r.output


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_parsers_answer_or_refuse_in_one_line(text) -> None:
    for parse in (parse_sla_pairs, lambda t: parse_span(t, "--telemetry-loss")):
        try:
            parse(text)
        except ValueError as exc:
            assert "\n" not in str(exc).strip() or "\n" in text


def test_sla_pairs_parse_to_the_sla() -> None:
    assert parse_sla_pairs("ttft_ms=2000, itl_ms=50") == SLA(ttft_ms=2000, itl_ms=50)
    assert parse_sla_pairs("e2e_ms=30000") == SLA(e2e_ms=30000)
    assert parse_sla_pairs('{"ttft_ms": 1, "itl_ms": 2}') == SLA(ttft_ms=1, itl_ms=2)
    assert parse_span(" 1.5 : 7 ", "--x") == (1.5, 7.0)


@st.composite
def _small_group(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(4, 40))
    reqs = []
    t = 0.0
    gap = draw(st.sampled_from([300.0, 3000.0]))  # bursts of long prompts keep every worker prefilling
    for k in range(n):
        t += draw(st.floats(0, gap))
        reqs.append(TraceRequest(timestamp_ms=t, input_length=draw(st.integers(16, 30000)),
                                 output_length=draw(st.integers(1, 300)), hash_ids=(k,)))
    workers = draw(st.integers(2, 4))
    g = draw(st.integers(1, 2))
    ratio = draw(st.floats(1.05, 1.6))
    period = draw(st.sampled_from([1.0, 2.0]))
    loss = None
    if draw(st.booleans()):
        a = draw(st.integers(0, 30))
        loss = (float(a), float(a + draw(st.integers(1, 20))))
    cfg = WhatIfConfig(workers=workers, gpus_per_worker=g, cap_w=700.0, limit_w=workers * g * 700.0 / ratio,
                       priority_split=draw(st.sampled_from([0.0, 0.5, 1.0])), telemetry_loss=loss,
                       actuation_s=draw(st.floats(0, 0.9)), guard=GuardSettings(period_s=period))
    return reqs, cfg


@settings(max_examples=30, deadline=None)
@given(_small_group())
def test_no_excursion_outlasts_two_periods_and_the_fallback_holds_the_limit(case) -> None:
    reqs, cfg = case
    try:
        run = run_whatif(prepare(reqs, warmup_s=0.0), cfg)
    except ValueError as exc:  # a loss drawn after the replay's end is refused, not silently ignored (issue 31)
        assert cfg.telemetry_loss is not None and "starts after the replay ended" in str(exc), exc
        return
    rep = report(run)
    period = cfg.guard.period_s
    assert rep.excursions.longest_s <= 2 * period
    assert rep.completed == rep.requests
    assert rep.draw_w.max is not None and rep.draw_w.max <= rep.requested_w + 1e-6
    if cfg.telemetry_loss is not None and rep.fallback.longest_reaction_s is not None:
        a, b = cfg.telemetry_loss
        assert rep.fallback.longest_reaction_s <= period * (1 + GRACE) + 1e-9  # the overlay's freshness rule
        # every whole second between the safe caps binding and the loss' end is under the limit
        first = int(a + rep.fallback.longest_reaction_s) + 1
        inside = run.timeline.group_w[first:int(b)]
        assert all(w <= cfg.limit_w + 1e-6 for w in inside)
