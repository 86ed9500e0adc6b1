"""`power whatif --fault KIND:GPUS:START:END` (power/faults.py): the what-if's sensor and agent faults, with
the same excursion and fallback figures, and options outside the replay refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.power.faults import KINDS, check_gpus, check_span, parse_fault
from powerfleet.power.guard import GuardSettings
from powerfleet.power.report import report
from powerfleet.power.whatif import WhatIfConfig, run_whatif
from tests.power.test_whatif import EXE, LIMIT, SLICE, arrivals  # noqa: F401 - the module fixture


def run(arr, *faults: str, guard: GuardSettings | None = None):  # type: ignore[no-untyped-def]
    cfg = WhatIfConfig(workers=8, gpus_per_worker=4, cap_w=700.0, limit_w=LIMIT, load_scale=1.2,
                       faults=tuple(parse_fault(f) for f in faults), guard=guard or GuardSettings())
    return report(run_whatif(arr, cfg))


@pytest.mark.parametrize("kind", KINDS)
def test_under_each_fault_no_excursion_lasts_longer_than_two_periods(arrivals, kind: str) -> None:  # noqa: F811
    # two workers' GPUs (8 of 32) faulted for 90 of the slice's 150 s
    rep = run(arrivals, f"{kind}:0-7:30:120")
    assert rep.faults == [f"{kind}:0-7:30:120"], rep.faults
    assert rep.excursions.longest_s <= 2, rep.excursions
    assert rep.completed == rep.requests, rep
    if kind == "agent-restart":  # its safe caps from its own state, at its first pass
        assert rep.fallback.activations == 1 and rep.fallback.longest_reaction_s == 0.5, rep.fallback
    else:
        assert rep.fallback.activations == 0, rep.fallback


def test_the_figures_show_what_trusting_a_zero_reading_costs(arrivals) -> None:  # noqa: F811
    checked = run(arrivals, "zero:0-15:30:120")
    trusted = run(arrivals, "zero:0-15:30:120", guard=GuardSettings(floor_w=0))  # 0 W believed
    assert trusted.excursions.count > checked.excursions.count, (trusted.excursions, checked.excursions)
    assert trusted.excursions.max_over_w > checked.excursions.max_over_w, (trusted.excursions, checked.excursions)


def test_faults_run_deterministically_and_are_in_the_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cmd = [str(EXE), "power", "whatif", "--trace", str(SLICE), "--workers", "8", "--gpus-per-worker", "4",
           "--cap-w", "700", "--limit-w", str(LIMIT), "--load-scale", "1.2", "--fault", "stuck:0-3:30:60",
           "--fault", "agent-dead:4-7,9:40:90", "--json"]
    a, b = (subprocess.run(cmd, capture_output=True, text=True, timeout=300) for _ in range(2))
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    assert json.loads(a.stdout)["faults"] == ["stuck:0-3:30:60", "agent-dead:4-7,9:40:90"]


@pytest.mark.parametrize(("args", "message"), [
    (["--fault", "agent-dead:0-3:300:360"], "--fault agent-dead:0-3:300:360 starts after the replay ended at 173 s"),
    (["--telemetry-loss", "174:200"], "--telemetry-loss 174:200 starts after the replay ended at 173 s"),
    (["--fault", "zero:30-40:10:20"], "--fault zero:30-40:10:20: the group has GPUs 0-31, not 40"),
    (["--fault", "melted:0:10:20"], "--fault 'melted:0:10:20': unknown kind 'melted'; one of unreadable, zero, "
                                    "stuck, agent-dead, agent-restart"),
    (["--fault", "zero:0:20:10"], "--fault 'zero:0:20:10': must satisfy 0 <= START < END (finite seconds)"),
    (["--fault", "zero:a:1:2"], "--fault 'zero:a:1:2': GPUS must be indexes or ranges like 0-3,6, got 'a'"),
    (["--fault", "zero:0:1"], "--fault must be KIND:GPUS:START:END (KIND one of unreadable, zero, stuck, "
                              "agent-dead, agent-restart), got 'zero:0:1'"),
])
def test_options_outside_the_replay_or_the_group_fail_in_one_line(args: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, "-m", "powerfleet.cli", "power", "whatif", "--trace", str(SLICE),
                        "--workers", "8", "--gpus-per-worker", "4", "--cap-w", "700", "--limit-w", str(LIMIT),
                        "--load-scale", "1.2", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert p.stderr == f"powerfleet: error: {message}\n", p.stderr


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40),
                 st.tuples(st.sampled_from([*KINDS, "x"]), st.text("0123456789-,", max_size=8),
                           st.text("0123456789.-e", max_size=5), st.text("0123456789.-e", max_size=5)
                           ).map(":".join)))
def test_the_fault_parser_fails_only_in_one_line(text: str) -> None:
    try:
        f = parse_fault(text)
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("--fault"), str(exc)
        return
    assert f.kind in KINDS and 0 <= f.start_s < f.end_s and f.gpus == tuple(sorted(set(f.gpus)))
    assert parse_fault(f.text()) == f
    check_gpus([f], f.gpus[-1] + 1)  # within the replay and the group: accepted
    check_span([f], None, f.start_s + 0.5)
