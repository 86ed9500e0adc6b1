"""Admission to an oversubscribed group (power/admission.py): each rule refuses with its reason, stale
telemetry closes admission, and the stored draw history is parsed without ever raising."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.power.admission import (AdmissionRule, admission_rule, admit, ceiling, floor_of, group_capacity, p99,
                                       parse_draw_history)

NOW = 1000.0
CALM = [(NOW - k, 700.0 + (k % 7) * 10) for k in range(300)]  # p99 760 W


def check(requested: float = 1200.0, minimum: float = 800.0, draw=CALM, now: float = NOW):  # type: ignore[no-untyped-def]
    return admit("rack-a", 1000.0, 1.3, requested, minimum, draw, now, window_s=300.0, reserve_w=50.0, stale_s=2.0)


def test_a_group_within_every_rule_admits() -> None:
    a = check()
    assert a.admitted and a.reason is None and a.p99_w == 760.0


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"requested": 1301.0}, "requested_over_ratio"),
    ({"minimum": 1001.0}, "minimum_over_limit"),
    ({"draw": CALM + [(NOW - 0.5, 990.0)] * 4}, "measured_over_limit"),  # 4 of 304 samples: inside the p99
    ({"draw": [(t - 2.5, w) for t, w in CALM]}, "telemetry_stale"),  # the newest is 2.5 s old
    ({"draw": [(NOW - 400, 500.0)]}, "telemetry_stale"),  # nothing in the window
    ({"draw": []}, "telemetry_stale"),
])
def test_each_rule_refuses_with_its_reason(kwargs, reason) -> None:  # type: ignore[no-untyped-def]
    a = check(**kwargs)
    assert not a.admitted and a.reason == reason and "rack-a" in a.message and "\n" not in a.message


def test_stale_telemetry_closes_admission_even_when_the_caps_fit() -> None:
    a = check(requested=500.0, minimum=200.0, now=NOW + 10)
    assert a.reason == "telemetry_stale" and a.message.endswith("admission closed")


def test_p99_is_nearest_rank() -> None:
    assert p99([1.0]) == 1.0 and p99(list(range(1, 101))) == 99 and p99(list(range(1, 201))) == 198


def test_the_draw_history_skips_what_is_malformed() -> None:
    good = json.dumps([5.0, 900.0])
    assert parse_draw_history([good, b"[1, 2]", "nope", "[1]", "[1, -3]", '[1, "x"]', "{}", "[NaN, 1]"]) == [
        (5.0, 900.0), (1.0, 2.0)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=30), st.binary(max_size=30),
                          st.lists(st.one_of(st.floats(), st.integers(), st.text(max_size=3)), max_size=3)
                          .map(json.dumps)), max_size=10))
def test_the_history_parser_never_raises(raw) -> None:  # type: ignore[no-untyped-def]
    for t, w in parse_draw_history(raw):
        assert w >= 0 and t == t


# --- the group's capacity, as the budget tick asks for it -------------------------------------------

FRESH = [(NOW - k, 1000.0) for k in range(60)]  # p99 1,000 W of a 2,000 W limit


def capacity(charged: int = 2000, floor: float | None = 0.4, draw=FRESH, ratio: float = 1.5):  # type: ignore[no-untyped-def]
    return group_capacity("rack-a", 2000, ratio, charged, floor, draw, NOW, window_s=300.0, reserve_w=100.0,
                          stale_s=2.0)


def test_an_open_group_shares_ratio_times_its_limit() -> None:
    got = capacity()
    assert got.admission.admitted and got.watts == 3000


def test_the_minimum_caps_lower_the_ceiling_below_the_ratio() -> None:
    # every GPU's minimum is 0.8 of its cap: 2,500 W of caps put 2,000 W of minimums on a 2,000 W limit
    assert capacity(floor=0.8).watts == 2500
    assert ceiling(2000, 1.5, 0.0) == 3000


@pytest.mark.parametrize(("kwargs", "reason", "watts"), [
    ({"draw": []}, "telemetry_stale", 2000),  # closed at the cap-sum budget ...
    ({"draw": [], "charged": 2600}, "telemetry_stale", 2600),  # ... or today's charge: held, not shrunk
    ({"floor": None}, "telemetry_stale", 2000),  # the guard knows none of its GPUs
    ({"draw": [(NOW, 1950.0)]}, "measured_over_limit", 2000),  # 1,950 + 100 W reserve > 2,000 W
    ({"charged": 3500}, "requested_over_ratio", 3000),  # over the ratio: back to the ceiling
])
def test_a_closed_group_holds_its_charge_within_the_limit_and_the_ceiling(kwargs, reason, watts) -> None:  # type: ignore[no-untyped-def]
    got = capacity(**kwargs)
    assert not got.admission.admitted and got.admission.reason == reason and got.watts == watts


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.floats(1.0, 4.0), st.none() | st.floats(0.0, 1.0),
       st.lists(st.tuples(st.floats(NOW - 400, NOW), st.floats(0, 3000)), max_size=5))
def test_the_capacity_never_passes_the_ceiling_nor_drops_below_the_limit(charged, ratio, floor, draw) -> None:  # type: ignore[no-untyped-def]
    got = capacity(charged=charged, floor=floor, draw=draw, ratio=ratio)
    top = ceiling(2000, ratio, floor or 0.0)
    assert 2000 <= got.watts or top < 2000
    assert got.watts <= max(2000, int(top))
    if not got.admission.admitted:  # closed: no growth beyond what is charged now, unless within the limit
        assert got.watts <= max(2000, charged)


def test_the_guards_memory_gives_the_floor_and_anything_else_gives_none() -> None:
    mem = {"gpus": {"a": {"min_w": 200, "cap_w": 700}, "b": {"min_w": 200, "cap_w": 500}}}
    assert floor_of(mem) == 0.4
    assert floor_of({"gpus": {}}) is None and floor_of({}) is None and floor_of([1]) is None
    assert floor_of({"gpus": {"a": {"min_w": "x", "cap_w": 1}}}) is None


class StoredPower:
    def __init__(self, draw: dict[str, list[tuple[float, float]]], floor: dict[str, float]) -> None:
        self._draw, self._floor = draw, floor

    def draw(self, group: str) -> list[tuple[float, float]]:
        return self._draw.get(group, [])

    def floor_fraction(self, group: str) -> float | None:
        return self._floor.get(group)


def test_the_rule_replaces_only_the_oversubscribed_groups_budgets() -> None:
    rule = AdmissionRule({"fresh": 1.5, "quiet": 1.5}, StoredPower({"fresh": FRESH}, {"fresh": 0.3, "quiet": 0.3}),
                         window_s=300.0, reserve_fraction=0.05, stale_s=2.0)
    shared, got = rule.capacities({"fresh": 2000, "quiet": 2000, "plain": 2000}, {"fresh": 2000, "quiet": 2000}, NOW)
    assert shared == {"fresh": 3000, "quiet": 2000, "plain": 2000}
    assert sorted(got) == ["fresh", "quiet"] and got["quiet"].admission.reason == "telemetry_stale"


def test_no_oversubscribed_group_means_no_rule() -> None:
    from powerfleet.config.fleet import FleetConfig

    assert admission_rule(FleetConfig.model_validate({"budget": {"groups": {"r": 1000}}}), None) is None
    cfg = FleetConfig.model_validate({"budget": {"groups": {"r": {"limit_w": 1000, "oversubscription": 1.3}}},
                                      "power": {"guard_period_s": 2}})
    rule = admission_rule(cfg, None)
    assert rule is not None and rule.ratios == {"r": 1.3} and rule.stale_s == 4.0
