"""A scenario's own checks (twin/demo/scenario_checks.py), pure: each rack's physical watts against its
limit at the time, and each deployment's SLA attainment or the cause that bound it."""

from __future__ import annotations

from types import SimpleNamespace

from powerfleet.twin.gpus.nodes import GpuSample
from powerfleet.twin.runtime import Sample
from powerfleet.twin.demo.scenario_checks import no_rack_over_limit, reasons_during, retune_applied, slo

RACKS = {"n0": "rack-a", "n1": "rack-b"}


def _sample(t: float, gpus: list[tuple[str, float, float | None]], limit_w: float) -> Sample:
    """``gpus``: (node, enforced cap, annotation or None) of GPUs that run a pod."""
    samples = [GpuSample(node, i, f"GPU-{i}", cap, 100.0, f"pod-{i}", "decode", False)
               for i, (node, cap, _) in enumerate(gpus)]
    samples.append(GpuSample("n0", 99, "GPU-idle", 700.0, 60.0, None, None, False))  # no pod: not counted
    annotated = {f"{node}/{i}": want for i, (node, _, want) in enumerate(gpus)}
    return Sample(t, 0.0, {"rack-a": 100.0 * len(gpus)}, samples, annotated, {}, {"rack-a": limit_w})


def test_a_pod_counts_at_the_larger_of_its_annotation_and_its_enforced_limit() -> None:
    # An unenforced annotation (cap still 700) and a cap under its annotation both count high.
    held = no_rack_over_limit([_sample(0, [("n0", 700.0, 400.0), ("n0", 300.0, 500.0)], 1200.0)], RACKS, {})
    assert held.ok and held.figures["racks"]["rack-a"]["physical_w_max"] == 1200.0, held
    over = no_rack_over_limit([_sample(0, [("n0", 700.0, 400.0), ("n0", 300.0, 500.0)], 1199.0)], RACKS, {})
    assert not over.ok and "rack rack-a 1 W over its limit at t=0" in over.detail, over


def test_a_tenant_without_annotation_counts_at_its_enforced_limit() -> None:
    check = no_rack_over_limit([_sample(5, [("n0", 700.0, None)], 650.0)], RACKS, {})
    assert not check.ok and "50 W over" in check.detail, check


def test_samples_where_the_minimums_do_not_fit_are_not_judged_and_are_counted() -> None:
    # Three pods' GPUs need at least 600 W; a 500 W limit cannot hold, whatever the caps.
    samples = [_sample(0, [("n0", 400.0, 400.0)] * 3, 2000.0), _sample(1, [("n0", 400.0, 400.0)] * 3, 500.0)]
    check = no_rack_over_limit(samples, RACKS, {})
    assert check.ok, check
    assert "1 rack samples where the pods' minimums exceeded the limit (not judged)" in check.detail, check
    assert check.figures["racks"]["rack-a"]["limit_w_min"] == 500.0 and check.figures["racks"]["rack-a"]["limit_w"] == 500.0


def test_no_samples_is_a_failed_check() -> None:
    assert not no_rack_over_limit([], RACKS, {}).ok


def _windows(dgd: str, ttfts: list[float]) -> list[SimpleNamespace]:
    return [SimpleNamespace(dgd=dgd, ttft_ms_current=t, start=float(i)) for i, t in enumerate(ttfts)]


def test_slo_holds_within_the_target_or_with_the_binding_cause_named() -> None:
    within = slo(_windows("a", [100.0] * 9 + [900.0]), {"a": 500.0}, {}, {})
    assert within.ok and "a 90% of 10 windows within 500 ms" in within.detail, within
    bound = slo(_windows("a", [900.0] * 4), {"a": 500.0}, {"a": ["power_budget_clamped"]}, {"a": ["rack-a"]})
    assert bound.ok and "(worst 900 ms, 400 ms over): bound by power_budget_clamped; raise the limit of rack-a" in \
        bound.detail, bound
    assert bound.figures["deployments"]["a"]["attainment"] == 0.0
    gpus = slo(_windows("a", [900.0]), {"a": 500.0}, {"a": ["gpu_capacity"]}, {"a": ["rack-a"]})
    assert gpus.ok and "add GPUs to its racks" in gpus.detail, gpus


def test_slo_fails_when_missed_and_nothing_bound_it_or_nothing_was_measured() -> None:
    missed = slo(_windows("a", [900.0, 100.0]), {"a": 500.0}, {"a": ["rollout_scale_up_held"]}, {})
    assert not missed.ok and "a 50% of 2 windows within 500 ms (worst 900 ms) and nothing bound its scale" in \
        missed.detail, missed
    unmeasured = slo([], {"a": 500.0}, {}, {})
    assert not unmeasured.ok and "a: no window measured its TTFT" in unmeasured.detail, unmeasured
    assert not slo([], {}, {}, {}).ok


def test_slo_judges_itl_beside_ttft_and_a_window_without_itl_by_its_ttft() -> None:
    ws = [SimpleNamespace(dgd="a", start=float(i), ttft_ms_current=100.0, itl_ms_current=itl)
          for i, itl in enumerate([10.0] * 8 + [80.0, None])]
    held = slo(ws, {"a": 500.0}, {}, {}, itl={"a": 50.0})
    f = held.figures["deployments"]["a"]
    assert held.ok and f["attainment"] == 0.9 and f["itl_windows"] == 9 and f["itl_ms_worst"] == 80.0, held
    assert "a 90% of 10 windows within 500 ms TTFT and 50 ms ITL" in held.detail, held
    missed = slo(ws, {"a": 500.0}, {}, {}, itl={"a": 5.0})
    assert not missed.ok and "within 500 ms TTFT and 5 ms ITL (worst 100 ms, worst ITL 80.0 ms)" in missed.detail, \
        missed


def test_a_clamp_explains_a_miss_only_while_it_was_in_force() -> None:
    changes = [(0.0, ["power_budget_clamped"]), (100.0, []), (300.0, ["gpu_capacity"])]
    assert reasons_during(changes, 50.0, 70.0) == {"power_budget_clamped"}
    assert reasons_during(changes, 90.0, 110.0) == {"power_budget_clamped"}
    assert reasons_during(changes, 150.0, 170.0) == set()
    assert reasons_during(changes, 290.0, 310.0) == {"gpu_capacity"}
    # A miss at 200 s, long after the clamp was lifted at 100 s, is not explained by it.
    ws = _windows("a", [900.0] * 2)
    ws = [SimpleNamespace(**{**w.__dict__, "start": 200.0 + 20 * i}) for i, w in enumerate(ws)]
    late = slo(ws, {"a": 500.0}, {"a": {"power_budget_clamped"}}, {"a": ["rack-a"]}, reasons_at={"a": changes},
               window_s=20.0)
    assert not late.ok and "nothing bound its scale" in late.detail, late
    early = slo(ws, {"a": 500.0}, {}, {"a": ["rack-a"]}, reasons_at={"a": [(0.0, ["power_budget_clamped"])]},
                window_s=20.0)
    assert early.ok and "bound by power_budget_clamped" in early.detail, early


def test_retune_applied_needs_an_applied_window() -> None:
    assert not retune_applied({"a": [{"window": 1, "outcome": "keep"}]}).ok
    check = retune_applied({"a": [{"window": 1, "outcome": "keep"}, {"window": 2, "outcome": "apply"}]})
    assert check.ok and check.detail == "2 windows decided, 1 applied", check


def test_a_retune_line_never_calls_a_worse_candidate_best() -> None:
    from powerfleet.twin.demo.view import decision_text

    worse = decision_text("keep: best 1269.76 vs probe 1255.58 ms (mean TTFT) (minimize), -1.129 % is worse than the probe")
    assert worse == ("keep: no candidate beat the current settings (top candidate 1269.76 vs current 1255.58 ms "
                     "(mean TTFT), 1.129 % worse)"), worse
    tie = decision_text("best 5 vs probe 5 ms (mean TTFT) (minimize), -0.000 % ties the probe; keeping the current "
                        "settings; held at the current value")
    assert "-0.000" not in tie and "best" not in tie and "the same); held at the current value" in tie, tie
    small = decision_text("best 10878.9 vs probe 10924.6 ms (mean TTFT) (minimize), +0.418 % does not beat the probe "
                          "by more than 1 %")
    assert small.startswith("no candidate beat the current settings by more than 1 % (") and "0.418 % better" in small
    applied = decision_text("best 9 vs probe 10 ms (mean TTFT) (minimize), +10.000 % beats the probe by more than 1 %")
    assert applied.startswith("a candidate beat the current settings by more than 1 %"), applied


def test_abandoned_windows_carry_their_reason_into_the_check() -> None:
    from powerfleet.twin.demo.checks import windows_decided

    check = windows_decided({("a", 1), ("a", 2)}, {("a", 1): "keep", ("a", 2): "abandoned"}, (), ("keep",),
                            {("a", 2): "a window 10:00:20-10:00:30: blocked: dgd-unsettled"})
    assert check.ok and check.detail == ("2 launched windows ended: 1 abandoned, 1 keep (abandoned: a window "
                                         "10:00:20-10:00:30: blocked: dgd-unsettled)"), check


def test_a_deployment_on_two_racks_is_not_said_to_have_a_share_of_each() -> None:
    from powerfleet.twin.demo.report import budget_event

    status = {"reason": "Planned", "powerLimitWatts": 10020, "ownLimitWatts": 22400, "group": "rack-a,rack-b",
              "settledWatts": 8000}
    line = budget_event("default/llm-disagg", status, {"rack-a": 9960.0, "rack-b": 9960.0})
    assert "limit 10020 W = what it holds now plus the least headroom of rack-a (9960 W) and rack-b (9960 W), " \
           "under its own 22400 W" in line and "share" not in line, line
    one = budget_event("default/llm-agg", {**status, "powerLimitWatts": 5000, "group": "rack-a"}, {"rack-a": 9960.0})
    assert "limit 5000 W = its share of rack-a (9960 W), under its own 22400 W" in one, one


def test_a_traffic_multiplier_plays_the_trace_that_many_times_as_fast_from_then_on() -> None:
    import yaml

    from powerfleet.sim.trace import TraceRequest
    from powerfleet.twin.demo.scenario_load import parse
    from powerfleet.twin.demo.scenario_twin import multiplier_at
    from powerfleet.twin.serving.traffic import TrafficSource

    reqs = [TraceRequest(float(ms), 100, 10, (1,)) for ms in range(0, 1_000_000, 100)]  # 10 a trace second
    source = TrafficSource.from_requests("d", reqs, speedup=1)
    counts = [len(source.due(10.0))]
    source.rate = 2.0
    counts.append(len(source.due(20.0)))  # the next 10 s at twice the rate
    source.rate = 0.5
    counts.append(len(source.due(30.0)))
    assert all(abs(n - want) <= 1 for n, want in zip(counts, (100, 200, 50))), counts
    scenario = parse(yaml.safe_dump({
        "version": 1, "name": "m", "duration_s": 100,
        "topology": {"racks": {"rack-a": {"nodes": [{"count": 1}]}}},
        "deployments": {"llm-agg": {"builtin": "llm-agg"}},
        "traffic": {"llm-agg": {"multipliers": [{"at": "50%", "x": 2}, {"at": 75, "x": 1}]}}}), "m")
    assert [multiplier_at(scenario, "llm-agg", t) for t in (0, 49.9, 50, 74, 75, 99)] == [1, 1, 2, 2, 1, 1]
    assert multiplier_at(scenario, "llm-disagg", 60) == 1.0


def test_samples_before_the_agents_first_pass_are_counted_not_judged() -> None:
    boot = _sample(1.0, [("n0", 700.0, 300.0)] * 3, 1000.0)  # default limits: 2100 W physical
    capped = _sample(5.0, [("n0", 300.0, 300.0)] * 3, 1000.0)
    judged = no_rack_over_limit([boot, capped], RACKS, {"rack-a": 1000.0}, since=5.0)
    assert judged.ok and "1 samples before the agents' first pass (not judged)" in judged.detail, judged
    assert not no_rack_over_limit([boot, capped], RACKS, {"rack-a": 1000.0}).ok
