"""The pure planner: rules, the seed's worked cases, and invariants over random inputs."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from powerfleet.budget.planner import Budget, Plan, PlanError, Reason, RoleFacts, plan

BIG = 10**9


def pair(p: RoleFacts, d: RoleFacts) -> dict[str, RoleFacts]:
    return {"prefill": p, "decode": d}


def R(w: int = 1, g: int = 1, mn: int = 1, ready: int | None = 1, proposed: int | None = None, rolling: bool = False,
      **counts: int) -> RoleFacts:
    return RoleFacts(watts_per_replica=w, gpus_per_replica=g, min_replicas=mn, ready=ready, proposed=proposed,
                     rolling=rolling, **counts)


# --- the seed's worked cases ------------------------------------------------------------


def test_opposing_rebalance_1p4d_to_4p1d_is_staged():
    out = plan(pair(R(ready=1, proposed=4), R(ready=4, proposed=1)), Budget(5))
    assert out.targets == {"prefill": None, "decode": 1}  # scale-down now, scale-up held (None)
    assert Reason.POWER_STAGED in out.reasons and out.staged_goal == {"prefill": 4, "decode": 1}
    assert out.peak_w == 5 and out.settled_w == 2
    nxt = plan(pair(R(ready=1, proposed=4), R(ready=1, proposed=1)), Budget(5))
    assert nxt.targets == {"prefill": 4, "decode": 1} and nxt.peak_w == 5


def test_over_budget_4_1_proposal_5_5_clamps_to_2_3_peaks_4_3_and_is_staged():
    roles = pair(R(w=2, ready=4, proposed=5), R(w=1, ready=1, proposed=5))
    out = plan(roles, Budget(7))
    assert out.staged_goal == {"prefill": 2, "decode": 3}
    # the goal's transition peak is per role max(current, target) = (4, 3): 4*2 + 3*1 = 11 > 7
    goal_peak = sum(max(roles[r].ready, n) * roles[r].watts_per_replica for r, n in out.staged_goal.items())
    assert goal_peak == 11 and Reason.POWER_STAGED in out.reasons
    assert out.targets == {"prefill": 2, "decode": None}
    nxt = plan(pair(R(w=2, ready=2, proposed=5), R(w=1, ready=1, proposed=5)), Budget(7))
    assert nxt.targets == {"prefill": 2, "decode": 3} and nxt.peak_w == 7


def test_decode_only_proposal_is_sized_against_the_residual_gpu_ceiling():
    out = plan(pair(R(ready=7), R(ready=1, proposed=7)), Budget(BIG, max_gpus=8))
    assert out.targets == {"prefill": None, "decode": 1} and out.gpus == 8  # never (7, 4)


def test_peer_alone_over_the_ceiling_holds_the_proposed_role_at_ready():
    out = plan(pair(R(ready=9), R(ready=1, proposed=4)), Budget(BIG, max_gpus=8))
    assert out.targets == {"prefill": None, "decode": None}  # held at min(4, 1) = 1: leave as is, never 0
    assert Reason.GPU_SCALE_UP_SUPPRESSED in out.reasons


# --- rules ----------------------------------------------------------------------------


def test_unproposed_role_keeps_its_count_and_is_charged_at_ready():
    out = plan(pair(R(w=100, ready=3), R(w=100, ready=2, proposed=6)), Budget(700))
    assert out.targets == {"prefill": None, "decode": 4} and out.settled_w == 700


def test_missing_current_is_baseline_zero_and_a_hold_there_never_patches_zero():
    out = plan(pair(R(w=100, ready=8), R(w=100, ready=None, proposed=3)), Budget(800))
    assert out.targets == {"prefill": None, "decode": None}
    assert Reason.POWER_SCALE_UP_SUPPRESSED in out.reasons
    grows = plan(pair(R(w=100, ready=2), R(w=100, ready=None, proposed=3)), Budget(800))
    assert grows.targets["decode"] == 3


def test_rollout_holds_scale_ups_and_lets_scale_downs_go():
    out = plan(pair(R(ready=2, proposed=5, rolling=True), R(ready=4, proposed=2)), Budget(BIG))
    assert out.targets == {"prefill": None, "decode": 2} and Reason.ROLLOUT_HOLD in out.reasons


def test_clamps_never_go_below_minimum_and_refuse_an_unfittable_minimum():
    out = plan(pair(R(w=100, mn=2, ready=2, proposed=10), R(w=100, mn=3, ready=3, proposed=10)), Budget(600))
    assert out.targets == {"prefill": 3, "decode": 3} and out.settled_w == 600
    with pytest.raises(PlanError, match=r"minimum footprint \(500 W\) exceeds the power limit \(400 W\)"):
        plan(pair(R(w=100, mn=2), R(w=100, mn=3)), Budget(400))


def test_over_budget_shrinks_without_growing_past_proposals_with_uneven_watts():
    out = plan(pair(R(w=1000, ready=6, proposed=6), R(w=10, ready=50, proposed=40)), Budget(3000))
    # 6 x 1000 + 50 x 10 = 6500 W now; the cheap role keeps its whole proposal, the dear one shrinks
    assert out.targets == {"prefill": 2, "decode": 40} and out.settled_w == 2400
    assert Reason.POWER_OVER_BUDGET_SHRINK in out.reasons
    flipped = plan(pair(R(w=10, ready=50, proposed=40), R(w=1000, ready=6, proposed=6)), Budget(3000))
    assert flipped.targets == {"prefill": 40, "decode": 2}  # the same answer whichever role is dear


def test_a_proposal_below_minimum_is_raised_to_it():
    out = plan({"worker": R(mn=2, ready=3, proposed=0)}, Budget(BIG))
    assert out.targets == {"worker": 2} and Reason.PROPOSAL_BELOW_MINIMUM in out.reasons


def test_gpu_floor_raises_proposed_roles_and_power_wins():
    up = plan(pair(R(ready=1, proposed=1), R(ready=1, proposed=1)), Budget(BIG, max_gpus=10, min_gpus=6))
    assert up.gpus == 6 and Reason.GPU_FLOOR_RAISED in up.reasons
    capped = plan(pair(R(w=100, ready=1, proposed=1), R(w=100, ready=1, proposed=1)), Budget(400, max_gpus=10, min_gpus=6))
    assert capped.gpus == 4 and Reason.GPU_FLOOR_VIOLATED in capped.reasons


def test_aggregated_single_role():
    out = plan({"worker": R(w=700, ready=2, proposed=9)}, Budget(4000))
    assert out.targets == {"worker": 5} and out.settled_w == 3500


# --- what holds GPUs (issue 18) ------------------------------------------------------------


def test_an_in_flight_scale_up_is_charged_and_holds_scale_ups():
    # decode is being scaled 1 -> 2 (spec 2, ready 1): charged at 2 (4,800 W), and not ready yet,
    # so prefill's scale-up is held: never 6 x 700 + 4,800 = 9,000 W once decode is ready.
    out = plan(pair(R(w=700, g=2, ready=2, proposed=6), R(w=2400, g=4, ready=1, desired=2)), Budget(8000))
    assert out.targets == {"prefill": None, "decode": None} and Reason.ROLLOUT_HOLD in out.reasons
    assert out.settled_w == 2 * 700 + 2 * 2400 and out.peak_w == out.settled_w


def test_surge_and_terminating_pods_are_charged():
    # decode spec 2, ready 2, but 3 pods exist (one surge): charged at 3 and rolling
    out = plan(pair(R(w=1000, ready=1, proposed=3), R(w=1000, ready=2, desired=2, pods=3)), Budget(5000))
    assert out.targets["prefill"] is None and out.settled_w == 1000 + 3 * 1000
    # not yet updated: rolling too (a Grove rollout writes no rollingUpdate phase)
    stale = plan(pair(R(ready=1, proposed=3), R(ready=2, updated=1)), Budget(BIG))
    assert stale.targets["prefill"] is None and Reason.ROLLOUT_HOLD in stale.reasons
    # a scale-down goes while rolling
    down = plan(pair(R(ready=3, proposed=1), R(ready=2, pods=3)), Budget(BIG))
    assert down.targets["prefill"] == 1


def test_gpu_peak_through_an_opposing_rebalance_is_staged():
    out = plan(pair(R(w=1, g=1, ready=1, proposed=4), R(w=1, g=1, ready=4, proposed=1)), Budget(BIG, max_gpus=5))
    assert out.targets == {"prefill": None, "decode": 1} and Reason.GPU_STAGED in out.reasons
    assert out.peak_gpus == 5 and out.staged_goal == {"prefill": 4, "decode": 1}
    nxt = plan(pair(R(w=1, g=1, ready=1, proposed=4), R(w=1, g=1, ready=1, proposed=1)), Budget(BIG, max_gpus=5))
    assert nxt.targets == {"prefill": 4, "decode": 1} and nxt.peak_gpus == 5


# The GPU clamp leaves decode at 2; the power clamp then cuts prefill, freeing GPUs that used to
# stay unused (decode stayed at 2 although 6 fits both ceilings).
NEEDLESS_SHRINK = ({"prefill": RoleFacts(1440, 2, 2, 1, 12), "decode": RoleFacts(74, 1, 0, 10, 12)}, Budget(4222, 10))


def test_replicas_freed_by_the_power_clamp_are_handed_back():
    roles, budget = NEEDLESS_SHRINK
    out = plan(roles, budget)
    final = {r: roles[r].charged if t is None else t for r, t in out.targets.items()}
    assert final == {"prefill": 2, "decode": 6} or out.staged_goal == {"prefill": 2, "decode": 6}, out
    assert final["decode"] == 6


def test_min_gpus_above_max_gpus_is_refused_in_one_line():
    with pytest.raises(PlanError, match=r"^budget.min_gpus: 12 is above budget.max_gpus \(10\)$"):
        plan(pair(R(), R()), Budget(BIG, max_gpus=10, min_gpus=12))


# --- invariants -------------------------------------------------------------------------

counts = st.integers(0, 12)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 2))
    roles = {}
    for name in ["prefill", "decode"][:n]:
        mn = draw(st.integers(0, 2))
        ready = draw(st.none() | counts)
        # mostly settled roles; sometimes a spec, revision or pod count ahead of (or behind) ready
        extra = draw(st.sampled_from([{}, {}, {}, "drawn"]))
        if extra == "drawn":
            extra = {"desired": draw(st.none() | counts), "updated": draw(st.none() | counts),
                     "pods": draw(st.none() | counts)}
        roles[name] = RoleFacts(
            watts_per_replica=draw(st.integers(1, 1500)), gpus_per_replica=draw(st.integers(0, 8)), min_replicas=mn,
            ready=ready, proposed=draw(st.none() | counts), rolling=draw(st.booleans()), **extra)
    ceiling = draw(st.sampled_from([-1, draw(st.integers(0, 60))]))
    floor = draw(st.sampled_from([-1, -1, draw(st.integers(0, 40 if ceiling < 0 else ceiling))]))
    return roles, Budget(draw(st.integers(0, 30000)), ceiling, floor)


def _usage(roles, t):
    w = sum(t[r] * f.watts_per_replica for r, f in roles.items())
    g = sum(t[r] * f.gpus_per_replica for r, f in roles.items())
    peak = sum(max(f.charged, t[r]) * f.watts_per_replica for r, f in roles.items())
    peak_g = sum(max(f.charged, t[r]) * f.gpus_per_replica for r, f in roles.items())
    return w, g, peak, peak_g


def _fits(roles, budget, t):
    w, g, peak, peak_g = _usage(roles, t)
    return w <= budget.power_limit_w and peak <= budget.power_limit_w and (
        budget.max_gpus < 0 or (g <= budget.max_gpus and peak_g <= budget.max_gpus))


def check_invariants(roles, budget):
    try:
        out: Plan = plan(roles, budget)
    except PlanError:
        mn_w = sum(f.min_replicas * f.watts_per_replica for f in roles.values())
        mn_g = sum(f.min_replicas * f.gpus_per_replica for f in roles.values())
        assert mn_w > budget.power_limit_w or 0 <= budget.max_gpus < mn_g
        return
    cur = {r: f.charged for r, f in roles.items()}
    final = {r: cur[r] if out.targets[r] is None else out.targets[r] for r in roles}
    assert (out.settled_w, out.gpus, out.peak_w, out.peak_gpus) == _usage(roles, final)
    rolling = any(f.rolling or f.in_flight for f in roles.values())
    for r, f in roles.items():
        if f.proposed is None:
            assert out.targets[r] is None  # unproposed roles stay null
            continue
        if out.targets[r] is not None:
            assert out.targets[r] >= f.min_replicas  # never below its minimum
            if budget.min_gpus < 0:
                assert out.targets[r] <= max(f.proposed, f.min_replicas)  # never above the proposal
            if rolling:
                assert out.targets[r] <= cur[r]  # nothing scales up while rolling or in flight
    if _fits(roles, budget, cur):  # whenever what is held now fits, the plan does too, through the transition
        assert out.settled_w <= budget.power_limit_w and out.peak_w <= budget.power_limit_w
        if budget.max_gpus >= 0:
            assert out.gpus <= budget.max_gpus and out.peak_gpus <= budget.max_gpus
    # No needless shrink: where the plan is heading (a staged rebalance's goal, else its targets), a
    # proposed role short of its proposal could not take one more replica within both ceilings.
    goal = {**final, **(out.staged_goal or {})}
    for r, f in roles.items():
        if f.proposed is None or (out.targets[r] is None and r not in (out.staged_goal or {})):
            continue
        if goal[r] >= max(f.proposed, f.min_replicas) or (rolling and goal[r] >= cur[r]) or budget.min_gpus >= 0:
            continue  # (the floor may raise a peer past its proposal: not judged here)
        w, g, _, _ = _usage(roles, {**goal, r: goal[r] + 1})
        assert w > budget.power_limit_w or 0 <= budget.max_gpus < g, (r, out)


@settings(max_examples=1500, deadline=None)
@given(cases())
@example(NEEDLESS_SHRINK)
def test_invariants(case):
    check_invariants(*case)


def test_a_clamped_scale_up_never_shrinks_a_peer_below_its_current_count_when_that_fits():
    # 600 W now (a 1, b 5 at 100 W each) fits the 800 W limit; a asks for 10. The clamp keeps every
    # role between its current count and its proposal: a gets the 200 W left, b keeps its 5.
    roles = {"a": RoleFacts(watts_per_replica=100, gpus_per_replica=1, ready=1, proposed=10),
             "b": RoleFacts(watts_per_replica=100, gpus_per_replica=1, ready=5, proposed=5)}
    out = plan(roles, Budget(power_limit_w=800))
    assert out.targets == {"a": 3, "b": 5} and out.settled_w == out.peak_w == 800
    assert out.reasons == ("power_budget_clamped",) and out.staged_goal is None
