"""Admission to an oversubscribed group (power/admission.py): each rule refuses with its reason, stale
telemetry closes admission, and the stored draw history is parsed without ever raising."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.power.admission import admit, p99, parse_draw_history

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
