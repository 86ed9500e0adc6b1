"""The guard (power/guard.py) and the safe caps (power/safe.py): pure, on an injected clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from powerfleet.clock import FakeClock
from powerfleet.power.guard import Guard, GroupRefused, GuardSettings, GuardState, GpuReading, decide
from powerfleet.power.safe import GpuRange, refusal, safe_caps

# the figures below assume these; the ceiling off: these tests are about the modes (test_cap_ceiling.py: the default)
S = GuardSettings(t1=0.90, t2=0.97, release=0.85, target=0.90, step_w=50.0, cap_ceiling=None)


def _gpus(n: int, priority: str = "high", cap: float = 700.0) -> list[GpuReading]:
    return [GpuReading(f"g{i}", priority, cap, 200.0, 700.0, None) for i in range(n)]


def _read(gpus: list[GpuReading], draws: list[float | None], at: float | None = None) -> list[GpuReading]:
    return [GpuReading(g.gpu, g.priority, g.cap_w, g.min_w, g.max_w, d, at) for g, d in zip(gpus, draws)]


def test_safe_caps_share_the_limit_in_proportion_to_the_requests() -> None:
    gpus = {"a": GpuRange(700, 200, 700), "b": GpuRange(350, 200, 700), "c": GpuRange(700, 200, 700)}
    safe = safe_caps(gpus, 1400.0)
    assert safe == pytest.approx({"a": 560.0, "b": 280.0, "c": 560.0})
    # a share under the minimum is raised to it and the others give it back: the sum stays the limit
    safe = safe_caps({"a": GpuRange(700, 200, 700), "b": GpuRange(100, 200, 700)}, 700.0)
    assert safe["b"] == 200.0 and safe["a"] == pytest.approx(500.0)
    # never above the request, even when the limit would allow it
    assert safe_caps({"a": GpuRange(300, 200, 700)}, 5000.0) == {"a": 300.0}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(100, 1000), st.floats(50, 300), st.floats(300, 1000)), min_size=1, max_size=12),
       st.floats(0.2, 2.0))
def test_safe_caps_fit_the_limit_within_each_range(rows, ratio) -> None:
    gpus = {f"g{i}": GpuRange(c, lo, hi) for i, (c, lo, hi) in enumerate(rows)}
    limit = ratio * sum(g.top_w for g in gpus.values())
    safe = safe_caps(gpus, limit)
    if refusal("r", gpus, limit) is None:
        assert math.fsum(safe.values()) <= limit * (1 + 1e-9)
    for k, g in gpus.items():
        assert g.min_w - 1e-9 <= safe[k] <= g.top_w + 1e-9


def test_a_group_that_cannot_fit_its_limit_at_the_minimums_is_refused_in_one_line() -> None:
    gpus = _gpus(4)  # 4 x 200 W minimum
    why = refusal("rack-a", {g.gpu: g.range() for g in gpus}, 700.0)
    assert why is not None and "\n" not in why and "800 W" in why and "700 W" in why
    with pytest.raises(GroupRefused, match="oversubscription refused"):
        decide(S, "rack-a", 700.0, _read(gpus, [100.0] * 4), GuardState(), 0.0)
    with pytest.raises(GroupRefused):
        Guard("rack-a", 700.0, clock=FakeClock(), gpus={g.gpu: g.range() for g in gpus})


def test_settings_refuse_thresholds_out_of_order() -> None:
    with pytest.raises(ValidationError, match="release < t1 <= t2"):
        GuardSettings(t1=0.8, release=0.9)
    with pytest.raises(ValidationError):
        GuardSettings(decrease=1.0)


def test_above_t1_only_low_priority_is_throttled_and_above_t2_low_first_then_high() -> None:
    gpus = _gpus(2, "high") + [GpuReading(f"l{i}", "low", 700.0, 200.0, 700.0, None) for i in range(2)]
    limit = 2000.0
    d = decide(S, "r", limit, _read(gpus, [460.0] * 4), GuardState(), 0.0)  # 1840 W = 0.92 L
    assert d.mode == "throttle_low"
    assert set(d.throttle) == {"l0", "l1"} and d.throttle["l0"] == pytest.approx(700 * S.decrease)
    assert {e.priority for e in d.events} == {"low"}
    d = decide(S, "r", limit, _read(gpus, [500.0] * 4), GuardState(), 0.0)  # 2000 W > 0.97 L
    # throttling all: low priority is cut first, to its minimums here (1,800 W - 2 x 700 W = 2 x 200 W),
    # and that is enough: high priority keeps its request (issue 31 item 4)
    assert d.mode == "throttle_all" and d.throttle == {"l0": 200.0, "l1": 200.0}, d
    assert math.fsum(d.in_force.values()) <= S.target * limit + 1e-6
    # with low priority exhausted (at its minimums), high priority takes the rest of the cut
    d = decide(S, "r", 1500.0, _read(gpus, [400.0] * 4), GuardState(throttle={"l0": 200.0, "l1": 200.0}), 0.0)
    assert d.mode == "throttle_all" and d.throttle["l0"] == d.throttle["l1"] == 200.0, d
    assert d.throttle["g0"] == d.throttle["g1"] == pytest.approx((0.90 * 1500 - 400) / 2), d
    assert {e.priority for e in d.events} == {"high"}
    # a low cut that needs less than ``decrease`` still takes at least ``decrease``; high stays whole
    d = decide(S, "r", 2880.0, _read(gpus, [699.0] * 4), GuardState(), 0.0)  # 2,796 W > 0.97 L
    assert d.throttle == {"l0": pytest.approx(700 * S.decrease), "l1": pytest.approx(700 * S.decrease)}, d


def test_release_is_stepwise_high_priority_first_and_held_under_t1() -> None:
    gpus = _gpus(1, "high") + [GpuReading("l0", "low", 700.0, 200.0, 700.0, None)]
    state = GuardState(throttle={"g0": 300.0, "l0": 300.0})
    d = decide(S, "r", 2000.0, _read(gpus, [200.0, 200.0]), state, 0.0)
    assert d.mode == "release" and d.throttle == {"g0": 300.0 + S.step_w, "l0": 300.0 + S.step_w}
    # little headroom below t1: the high-priority GPU takes it first
    big = S.model_copy(update={"step_w": 40.0})
    d = decide(big, "r", 1000.0, _read(gpus, [420.0, 420.0]), state, 0.0)  # 840 W < 0.85 L; room 60 W
    assert d.throttle == {"g0": 340.0, "l0": 320.0}
    # between release and t1: hold
    d = decide(S, "r", 1000.0, _read(gpus, [440.0, 440.0]), state, 0.0)
    assert d.mode == "hold" and d.throttle == {"g0": 300.0, "l0": 300.0}
    # back at the request: unthrottled
    d = decide(S, "r", 2000.0, _read(gpus, [10.0, 10.0]), GuardState(throttle={"g0": 690.0}), 0.0)
    assert "g0" not in d.throttle


def test_a_stale_reading_counts_at_the_safe_cap_and_that_gpu_is_left_at_it() -> None:
    clock = FakeClock(t=100.0)
    gpus = _gpus(4)
    guard = Guard("r", 2100.0, S, clock=clock)
    old = clock.now() - 3 * S.period_s  # older than two periods
    readings = _read(gpus[:3], [100.0] * 3, at=clock.now()) + _read(gpus[3:], [100.0], at=old)
    d = guard.tick(readings)
    assert d.stale == ("g3",)
    assert d.safe["g3"] == pytest.approx(525.0) and d.throttle["g3"] == pytest.approx(525.0)
    assert d.measured_w == pytest.approx(300.0 + 525.0)
    d = guard.tick(_read(gpus[:3], [100.0] * 3, at=clock.now()) + _read(gpus[3:], [None]))
    assert d.stale == ("g3",)


def _priorities(n: int):  # type: ignore[no-untyped-def]
    return st.lists(st.sampled_from(["high", "low"]), min_size=n, max_size=n)


@st.composite
def _scenario(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 8))
    mins = draw(st.lists(st.floats(100, 300), min_size=n, max_size=n))
    maxes = [m + draw(st.floats(50, 600)) for m in mins]
    caps = [draw(st.floats(lo, hi)) for lo, hi in zip(mins, maxes)]
    prios = draw(_priorities(n))
    floor = math.fsum(mins)
    limit = floor + draw(st.floats(0, 1.2)) * max(sum(caps) - floor, 0.0)
    rising = draw(st.lists(st.lists(st.floats(0, 1000), min_size=n, max_size=n), min_size=1, max_size=6))
    falls = draw(st.lists(st.lists(st.sampled_from([1.0, 1.0, 1.0, 0.97, 0.8, 0.5]), min_size=n, max_size=n),
                          min_size=4, max_size=10))
    stale = draw(st.lists(st.sampled_from([False, False, False, True]), min_size=n, max_size=n))
    gs = GuardSettings(t1=draw(st.floats(0.75, 0.95)), t2=0.97, release=0.7, step_w=draw(st.floats(1, 500)))
    return gs, mins, maxes, caps, prios, limit, rising, falls, stale


@settings(max_examples=150, deadline=None)
@given(_scenario())
def test_guard_brings_power_under_the_limit_and_keeps_it_while_demand_does_not_rise(sc) -> None:
    gs, mins, maxes, caps, prios, limit, rising, falls, stale = sc
    n = len(mins)
    gpus = [GpuReading(f"g{i}", prios[i], caps[i], mins[i], maxes[i], None) for i in range(n)]
    clock = FakeClock(t=0.0)
    guard = Guard("r", limit, gs, clock=clock)
    in_force = [min(max(c, lo), hi) for c, lo, hi in zip(caps, mins, maxes)]
    safe = safe_caps({g.gpu: g.range() for g in gpus}, limit)
    demand = rising[-1]
    trace = list(rising)
    for f in falls:  # from here on demand does not rise
        demand = [d * x for d, x in zip(demand, f)]
        trace.append(demand)
    calm_from = len(rising) - 1
    for p, dem in enumerate(trace):
        # a GPU whose telemetry is stale sits at its safe cap (its agent's fallback)
        cap_now = [safe[f"g{i}"] if stale[i] else in_force[i] for i in range(n)]
        draw_w = [min(d, c) for d, c in zip(dem, cap_now)]
        if p > calm_from:
            assert math.fsum(draw_w) <= limit * (1 + 1e-9) + 1e-6, (p, draw_w, limit)
        clock.advance(gs.period_s)
        d = guard.tick([GpuReading(g.gpu, g.priority, g.cap_w, g.min_w, g.max_w, None if stale[i] else draw_w[i],
                                   clock.now()) for i, g in enumerate(gpus)])
        in_force = [d.in_force[f"g{i}"] for i in range(n)]
        assert all(lo - 1e-9 <= c for c, lo in zip(in_force, mins))  # never below a GPU's minimum


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 10), st.floats(1.0, 1.3), st.lists(st.floats(0, 700), min_size=10, max_size=10),
       st.lists(st.floats(200, 700), min_size=10, max_size=10), st.sampled_from(["release", "hold", "throttle_low"]))
def test_a_cap_ceiling_bounds_the_caps_in_force_whatever_the_mode(n, ceiling, draws, throttle, mode) -> None:
    # 700 W requests, limit 0.7 x their sum: the minimums (200 W each) always fit the ceiling
    gpus = [GpuReading(f"g{i}", "low" if i % 2 else "high", 700.0, 200.0, 700.0, None) for i in range(n)]
    limit = 0.7 * 700.0 * n
    state = GuardState(throttle={f"g{i}": throttle[i] for i in range(0, n, 3)}, mode=mode)  # type: ignore[arg-type]
    s = GuardSettings(cap_ceiling=ceiling)
    d = decide(s, "r", limit, _read(gpus, draws[:n]), state, 0.0)
    assert math.fsum(d.in_force.values()) <= ceiling * limit * (1 + 1e-9)
    assert all(200.0 - 1e-9 <= w <= 700.0 for w in d.in_force.values())
    # off, an idle group keeps every request in force: 700 W x n, above 1.3 x 0.7 x 700 W x n
    free = decide(GuardSettings(cap_ceiling=None), "r", limit, _read(gpus, [0.0] * n), GuardState(), 0.0)
    assert math.fsum(free.in_force.values()) == 700.0 * n > ceiling * limit
