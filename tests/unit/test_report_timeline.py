"""The demo report's timeline: a budget line gives the limit and the share of the racks that set it."""

from __future__ import annotations

from powerfleet.twin.demo.report import budget_event

RACKS = {"rack-a": 5060, "rack-b": 5060}
BASE = {"reason": "Planned", "ownLimitWatts": 11200, "group": "rack-a,rack-b", "settledWatts": 3300,
        "peakWatts": 3900, "gpus": 6}


def test_a_clamp_names_the_share_of_the_racks_that_caused_it() -> None:
    # On two racks it may grow by the least headroom either leaves (budget/groups.py allocate_racks):
    # not "a share of" each, which read as a limit above each share it named (issue 35).
    line = budget_event("default/llm-disagg", {**BASE, "powerLimitWatts": 3060, "reasons": ["power_budget_clamped"]},
                        RACKS)
    assert line == ("budget default/llm-disagg: Planned [power_budget_clamped]: limit 3060 W = what it holds now "
                    "plus the least headroom of rack-a (5060 W) and rack-b (5060 W), under its own 11200 W; "
                    "settled 3300 W, peak 3900 W on 6 GPUs")
    one = budget_event("default/llm-disagg", {**BASE, "group": "rack-a", "powerLimitWatts": 3060}, RACKS)
    assert "limit 3060 W = its share of rack-a (5060 W), under its own 11200 W" in one, one


def test_a_limit_set_by_the_deployment_itself_says_so() -> None:
    within = budget_event("default/llm-agg", {**BASE, "powerLimitWatts": 11200, "reasons": []}, RACKS)
    assert "limit 11200 W = its own limit (the least headroom of rack-a (5060 W) and rack-b (5060 W) allows as " \
           "much)" in within, within
    one = budget_event("default/llm-agg", {**BASE, "group": "rack-a", "powerLimitWatts": 11200}, RACKS)
    assert "limit 11200 W = its own limit (its share of rack-a (5060 W) is no lower)" in one, one
    alone = budget_event("default/x", {"reason": "Planned", "powerLimitWatts": 800, "ownLimitWatts": 800}, {})
    assert alone == "budget default/x: Planned: limit 800 W = its own limit"


def test_a_share_below_the_minimum_footprint_is_given_with_the_footprint() -> None:
    status = {**BASE, "group": "rack-a", "powerLimitWatts": 1400, "reasons": ["power_budget_clamped"],
              "message": "power_budget_clamped; group rack-a: allowance 900 W is below the minimum footprint 1400 W"}
    line = budget_event("default/llm-disagg", status, RACKS)
    assert "limit 1400 W = its minimum footprint; its share of rack-a (5060 W) is only 900 W" in line


def test_an_evaluation_without_a_limit_gives_its_verdict_only() -> None:
    assert budget_event("default/x", {"reason": "AwaitingSettlement"}, RACKS) == "budget default/x: AwaitingSettlement"


def test_a_retune_reason_names_its_windows_as_clock_times() -> None:
    from powerfleet.cli.demo_run import _reason_text
    from powerfleet.twin.demo.view import window_span  # the demo's one clock (local time)

    text = _reason_text("keep", "keep: +5.6 % beats the probe, but prefill_load_scale moved at window 179612439 (1 -> 4)", 10)
    assert text == f" - +5.6 % beats the probe, but prefill_load_scale moved at window {window_span(179612439, 10)} (1 -> 4)"
    assert "179612439" not in text
