"""The oversubscription demo (`powerfleet demo --scenario oversubscribe`, twin/oversubscribe*.py): its
settings, its self-checks and its report section, judged on recorded data (a run of the scenario
itself takes about 75 s with the fleet's start; docs/power.md gives a run's figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerfleet.cli.demo_cmd import config_env
from powerfleet.config import load_config
from powerfleet.twin.gpus.nodes import GpuSample
from powerfleet.twin.demo.oversubscribe import OversubscribeScenario, fleet_values, group_limit, requested_w, twin_spec
from powerfleet.twin.demo.oversubscribe_checks import (CapChange, excursion_runs, fallback_check, no_long_excursion,
                                                  reaction_times, safe_bound_at, throttled)
from powerfleet.twin.demo.report import summary, write_report
from powerfleet.twin.runtime import Sample, Twin, TwinOptions

NODES = ["n0", "n1"]
LIMIT = 1000.0


def sample(t: float, draws: list[float], caps: list[float] | None = None, want: float = 500.0) -> Sample:
    """Four guarded GPUs (two per node; pods a-0..a-1 low, b-0..b-1 high) and one idle GPU drawing 70 W."""
    caps = caps or [want] * len(draws)
    gpus = [GpuSample(NODES[i // 2], i % 2, f"GPU-{i}", caps[i], w, f"{'ab'[i % 2]}-{i // 2}", "worker", False)
            for i, w in enumerate(draws)]
    gpus.append(GpuSample("n1", 7, "GPU-idle", 700.0, 70.0, None, None, False))
    return Sample(t, sum(draws) + 70, {"rack-a": sum(draws) + 70}, gpus,
                  {f"{g.node}/{g.index}": (want if g.pod else None) for g in gpus}, {})


def over(t: float) -> Sample:
    return sample(t, [260.0] * 4)  # 1,040 W: 40 W over


def under(t: float) -> Sample:
    return sample(t, [240.0] * 4)  # 960 W


def test_the_scenario_oversubscribes_one_rack_of_two_nodes_by_1_3() -> None:
    spec = twin_spec(0)
    assert spec.racks == {"rack-a": ["twin-gpu-00", "twin-gpu-01"]}
    assert requested_w(spec) == 4300 and group_limit(spec) == 3308  # 4,300 / 1.3
    twin = Twin(TwinOptions(spec=spec, tenants=False))
    cfg = load_config(environ=config_env(fleet_values(twin)))
    assert cfg.budget.oversubscribed() == {"rack-a": 3308} and cfg.budget.oversubscription_of("rack-a") == 1.3
    assert {k: d.priority for k, d in cfg.budget.deployments.items()} == {
        "default/llm-disagg": "high", "default/llm-agg": "low"}
    assert cfg.power.guard_period_s == 1.0 and cfg.retune.deployments == []
    # the guard's own process keeps its periods (beat's slipped with both cores busy: docs/power.md)
    assert cfg.power.guard_runner == "process"
    assert load_config(environ=config_env(fleet_values(twin, runner="beat"))).power.guard_runner == "beat"


def test_excursions_are_judged_on_the_guarded_gpus_and_may_last_two_periods() -> None:
    two = [under(0), over(1), over(2), under(3)]
    assert excursion_runs(two, NODES, LIMIT) == [(1, 2, pytest.approx(40.0))]
    assert no_long_excursion(two, NODES, LIMIT, period_s=1.0, tick_s=1.0).ok
    three = [under(0), over(1), over(2), over(3), under(4)]
    check = no_long_excursion(three, NODES, LIMIT, period_s=1.0, tick_s=1.0)
    assert not check.ok and "longest 3 s (allowed 2 s)" in check.detail
    # the idle GPU's 70 W is outside the guarded set: 960 W guarded is no excursion
    assert excursion_runs([under(0)], NODES, LIMIT) == []


SAFE = {("n1", 0): 250.0, ("n1", 1): 250.0}


def test_the_fallback_is_judged_from_the_time_telemetry_is_two_periods_old() -> None:
    initial = {("n1", 0): 500.0, ("n1", 1): 500.0}
    changes = [CapChange(10.4, "n1", 0, 500, 200), CapChange(12.3, "n1", 1, 500, 250),  # n1/0 held lower first
               CapChange(12.5, "n1", 0, 200, 250)]
    bound = safe_bound_at(changes, initial, SAFE, since=10.0)
    assert bound == 12.5  # a GPU below its safe cap is not yet in the fallback state
    ok = fallback_check(loss_at=10.0, last_report_at=9.9, bound_at=bound, period_s=1.0)
    assert ok.ok and "0.60 s after it was lost" in ok.detail  # lost at 9.9 + 2 = 11.9
    late = fallback_check(loss_at=10.0, last_report_at=9.9, bound_at=13.2, period_s=1.0)
    assert not late.ok and "1.30 s after" in late.detail
    assert not fallback_check(10.0, 9.9, None, 1.0).ok and not fallback_check(None, None, None, 1.0).ok
    assert safe_bound_at([], {("n1", 0): 250.0, ("n1", 1): 250.0}, SAFE, since=10.0) == 10.0


def test_the_reaction_runs_from_a_crossing_of_t2_to_the_next_lowered_cap() -> None:
    samples = [under(0), over(1), over(2), under(3), over(4)]
    changes = [CapChange(0.5, "n0", 0, 500, 450),  # before any crossing: not a reaction
               CapChange(2.3, "n0", 0, 450, 400), CapChange(2.4, "n0", 1, 400, 450),
               CapChange(5.1, "n1", 1, 500, 425)]
    assert reaction_times(samples, NODES, 0.98 * LIMIT, changes) == [pytest.approx(1.3), pytest.approx(1.1)]
    assert reaction_times(samples, NODES, 0.98 * LIMIT, []) == []


def test_throttling_is_counted_per_deployment_with_its_priority() -> None:
    samples = [sample(0, [240] * 4), sample(1, [240] * 4, caps=[400, 500, 400, 500]), sample(2, [240] * 4)]
    got = throttled(samples, NODES, {"a-0": "llm-agg", "a-1": "llm-agg", "b-0": "llm-disagg", "b-1": "llm-disagg"},
                    {"llm-agg": "low", "llm-disagg": "high"})
    assert got["llm-agg"] == {"priority": "low", "gpu_s_throttled": 2.0, "deepest_fraction": 0.8}
    assert got["llm-disagg"] == {"priority": "high", "gpu_s_throttled": 0.0, "deepest_fraction": 1.0}


def test_the_report_gains_its_section_plot_and_html(tmp_path: Path) -> None:
    twin = Twin(TwinOptions(spec=twin_spec(0), tenants=False, root=tmp_path / "twin"))
    sc = OversubscribeScenario(twin, redis_client=None, log=lambda line: None)
    samples = [sample(float(t), [240.0 + (30 if 3 <= t <= 4 else 0)] * 4) for t in range(8)]
    sc.nodes, sc.limit_w, sc.lost_node = NODES, LIMIT, "n1"
    sc.rec.changes = [CapChange(4.2, "n0", 0, 500, 400)]
    sc.rec.surge_at, sc.rec.surge_end, sc.rec.loss_at, sc.rec.loss_end = 2.0, 5.0, 6.0, 7.0
    data = summary(samples=samples, windows=[], checks=[], rack_budget_w={"rack-a": LIMIT}, fleet_budget_w=LIMIT,
                   extra={"scenario": "oversubscribe"})
    write_report(tmp_path, data, samples, [], {"rack-a": LIMIT})
    from powerfleet.twin.demo.oversubscribe_report import IMAGE, extend

    extend(tmp_path, data, samples, sc)
    stored = json.loads((tmp_path / "summary.json").read_text())
    sec = stored["oversubscribe"]
    assert sec["excursions"] == [{"t": 3.0, "seconds": 2, "max_over_w": 80.0}] and sec["reaction_s"] == [1.2]
    assert sec["surge"] == {"from_s": 2.0, "to_s": 5.0} and IMAGE in stored["images"]
    assert (tmp_path / IMAGE).stat().st_size > 0
    page = (tmp_path / "index.html").read_text()
    assert "Oversubscription: rack-a at 1.3x" in page and page.index("Oversubscription") < page.index("<h2>Plots")


def test_an_unknown_scenario_fails_in_one_line(tmp_path: Path) -> None:
    from tests.integration.conftest import run_cli

    from powerfleet.twin.demo.scenario_load import shipped

    out = run_cli("demo", "--scenario", "nope", "--report", str(tmp_path / "r"))
    names = shipped()
    assert {"default", "oversubscribe"} <= set(names), names
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"powerfleet: error: --scenario: 'nope' is neither a shipped scenario ({', '.join(names)}) nor a file path"
    ], out.stderr
