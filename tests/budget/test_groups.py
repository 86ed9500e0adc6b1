"""Group budgets: max-min fair shares over minimum footprints, growth only into free watts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.groups import Member, allocate, water_fill


def test_water_fill_is_max_min_fair():
    assert water_fill({"a": 10, "b": 100, "c": 100}, 90) == {"a": 10, "b": 40, "c": 40}
    assert water_fill({"a": 3, "b": 3}, 5) == {"a": 3, "b": 2}  # leftover unit in name order
    assert water_fill({"a": 5}, 0) == {"a": 0} and water_fill({}, 10) == {}


def test_shares_grant_minimums_first_and_growth_only_into_free_watts():
    members = {
        "a": Member(minimum_w=1000, demand_w=6000, current_w=5000, own_limit_w=10_000),
        "b": Member(minimum_w=1000, demand_w=6000, current_w=2000, own_limit_w=10_000),
    }
    res = allocate(8000, members)
    assert res.allowances["a"].share_w == 4000 and res.allowances["b"].share_w == 4000
    # a is above its share: it must shrink to 4000 now; b may grow only into the 1000 W free now
    assert res.allowances["a"].limit_w == 4000
    assert res.allowances["b"].growth_w == 1000 and res.allowances["b"].limit_w == 3000


def test_minimums_that_do_not_fit_refuse_growth():
    res = allocate(1500, {"a": Member(1000, 2000, 800, 5000), "b": Member(1000, 2000, 1000, 5000)})
    assert not res.feasible and res.allowances["a"].limit_w == 800


def test_deployments_that_may_land_on_a_rack_never_shrink_what_its_own_deployments_hold():
    # a holds 4,000 W of a 10,000 W rack and wants 6,000; ten deployments placed elsewhere, whose new
    # pods may land here, want 2,000 W each. Before: they took part in the shares, a's share fell to
    # 1,000 W and it was shrunk to 1,000 W (the whole fleet shrank to its minimums in bench/budget.py).
    members = {"a": Member(minimum_w=1000, demand_w=6000, current_w=4000, own_limit_w=10_000),
               **{f"r{i}": Member(minimum_w=0, demand_w=2000, current_w=0, own_limit_w=10_000, remote=True)
                  for i in range(10)}}
    res = allocate(10_000, members)
    assert res.allowances["a"].limit_w >= 4000, res.allowances["a"]
    # the free 6,000 W are split max-min fair among the eleven growers, a included
    growth = {k: a.growth_w for k, a in res.allowances.items()}
    assert sum(growth.values()) <= 6000 and min(growth.values()) >= 545, growth
    assert res.allowances["r0"].limit_w == growth["r0"], res.allowances["r0"]


members_st = st.dictionaries(
    st.sampled_from("abcdef"),
    st.builds(lambda mn, extra, cur, own, remote: Member(mn, mn + extra, cur, own, remote),
              st.integers(0, 3000), st.integers(0, 8000), st.integers(0, 9000), st.integers(0, 20_000), st.booleans()),
    min_size=1)


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, 30_000), members_st)
def test_group_invariants(budget, members):
    res = allocate(budget, members)
    if not res.feasible:
        return
    assert sum(a.share_w for a in res.allowances.values()) <= budget
    for k, a in res.allowances.items():
        m = members[k]
        assert a.share_w >= m.minimum_w  # everyone keeps its minimum footprint
        # a remote member grows only into free watts, toward its demand
        assert a.limit_w <= min(m.own_limit_w, m.demand_w if m.remote else a.share_w)
        if m.remote:
            assert a.limit_w <= m.current_w + a.growth_w
    # Each deployment's transition peak is at most max(current, limit); their sum fits whenever the
    # group's current draw fits.
    current = sum(m.current_w for m in members.values())
    if current <= budget:
        assert sum(max(m.current_w, res.allowances[k].limit_w) for k, m in members.items()) <= budget


def test_a_member_is_over_its_share_when_the_group_cannot_afford_what_it_holds_not_when_it_asks_less():
    # A shrinks by its own proposal (3,000 -> 2,000 W) on a group with room: its share follows its
    # demand, below what it holds, yet it is not over; B, holding 3,000 W on a budget lowered to
    # 5,000 W beside C's 2,500 W, is.
    roomy = allocate(10_000, {"A": Member(minimum_w=1000, demand_w=2000, current_w=3000, own_limit_w=8000),
                              "B": Member(minimum_w=1000, demand_w=3000, current_w=3000, own_limit_w=8000)})
    assert roomy.allowances["A"].limit_w == 2000 < 3000 and not roomy.allowances["A"].over_share
    assert not roomy.allowances["B"].over_share
    tight = allocate(5000, {"B": Member(minimum_w=1000, demand_w=3000, current_w=3000, own_limit_w=8000),
                            "C": Member(minimum_w=1000, demand_w=2500, current_w=2500, own_limit_w=8000)})
    assert tight.allowances["B"].over_share and tight.allowances["C"].over_share is False
    # the minimums alone do not fit: everyone above its minimum is over
    none = allocate(1500, {"B": Member(minimum_w=1000, demand_w=3000, current_w=3000, own_limit_w=8000),
                           "C": Member(minimum_w=1000, demand_w=1000, current_w=1000, own_limit_w=8000)})
    assert none.allowances["B"].over_share and not none.allowances["C"].over_share
