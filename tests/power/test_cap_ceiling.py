"""The guard's default cap ceiling (issue 31, finding 6 and "What to build" 3): by default the caps in force
sum to at most 1.25 x the limit, so an overshoot never passes a quarter of the limit whatever the ratio;
without it a group at 1.5x went 50 % over in the second its demand jumped. The guard and agent code in a
closed loop on an injected clock (powerfleet/testing/power_loop.py)."""

from __future__ import annotations

import pytest

from powerfleet.config import load_config
from powerfleet.config.fleet import PowerConfig
from powerfleet.power.guard import DEFAULT_CAP_CEILING, GuardSettings, released_caps
from powerfleet.power.safe import GpuRange
from powerfleet.testing.power_loop import ANNOTATION_W, Loop


def jump(loop: Loop) -> list[tuple[float, float]]:
    """Light load until the guard has released everything, then every GPU asks for all it may draw."""
    for g in loop.gpus:
        g.demand_w = 100.0
    loop.run(20)
    assert loop.over(0) == [], loop.history
    t = loop.clock.now()
    for g in loop.gpus:
        g.demand_w = ANNOTATION_W
    loop.run(10)
    assert loop.over(t + 3) == [], loop.over(t)  # the guard has it back under within two periods
    return loop.over(t)


@pytest.mark.parametrize("ratio", [1.3, 1.5, 2.0])
def test_by_default_an_overshoot_never_passes_a_quarter_of_the_limit(ratio: float) -> None:
    loop = Loop.of(2, 4, ratio=ratio)  # 8 x 700 W requested on 5,600 / ratio W
    over = jump(loop)
    assert over, "demand jumped between two periods: the first second is over the limit"
    worst = max(w for _, w in over)
    assert worst <= (DEFAULT_CAP_CEILING - 1) * loop.limit_w + 0.01, (worst, loop.limit_w, over)


def test_without_the_ceiling_the_overshoot_is_bounded_only_by_the_ratio() -> None:
    loop = Loop.of(2, 4, ratio=1.5, settings=GuardSettings(period_s=1.0, cap_ceiling=None))
    worst = max(w for _, w in jump(loop))
    assert worst == pytest.approx(0.5 * loop.limit_w, abs=0.1), (worst, loop.limit_w)  # every GPU at 700 W


def test_the_fleet_default_is_the_guards_and_can_be_turned_off() -> None:
    assert PowerConfig().cap_ceiling == GuardSettings().cap_ceiling == DEFAULT_CAP_CEILING == 1.25
    assert load_config(environ={"POWERFLEET_POWER__CAP_CEILING": "null"}).power.cap_ceiling is None
    assert load_config(environ={"POWERFLEET_POWER__CAP_CEILING": "1.1"}).power.cap_ceiling == 1.1


def test_released_caps_are_the_requests_or_their_share_under_the_ceiling_low_priority_first() -> None:
    # the demo's rack: llm-disagg (high) 4 x 600 W + 2 x 450 W, llm-agg (low) 2 x 500 W on 3,308 W (1.3x)
    gpus = {**{f"p{i}": ("high", GpuRange(600.0, 200.0, 700.0)) for i in range(4)},
            **{f"d{i}": ("high", GpuRange(450.0, 200.0, 700.0)) for i in range(2)},
            **{f"a{i}": ("low", GpuRange(500.0, 200.0, 700.0)) for i in range(2)}}
    caps = released_caps(GuardSettings(), "rack-a", 3308.0, gpus)  # type: ignore[arg-type]
    assert sum(caps.values()) == pytest.approx(1.25 * 3308.0), caps
    assert {g: caps[g] for g in gpus if g[0] != "a"} == {g: r.cap_w for g, (_, r) in gpus.items() if g[0] != "a"}
    assert caps["a0"] == caps["a1"] == pytest.approx((1.25 * 3308.0 - 3300.0) / 2), caps  # 417.5 W each
    # at 1.25x or less the ceiling never binds: every request stays in force
    assert released_caps(GuardSettings(), "rack-a", 4300.0 / 1.25, gpus) == {g: r.cap_w for g, (_, r) in gpus.items()}  # type: ignore[arg-type]
