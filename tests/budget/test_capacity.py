"""The GPU-capacity ceiling (budget/capacity.py, planner ``_capacity``): scale-ups stop at the GPUs
the nodes have free, and a ceiling below what is held holds, never shrinks."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

import json

from powerfleet.budget.capacity import GpuNeed, free_gpus, gpu_ceilings
from powerfleet.budget.io import answer
from powerfleet.budget.planner import Budget, PlanError, Reason, RoleFacts, plan
from powerfleet.cluster.gpu_pods import GpuPod

BIG = 10**9


def R(w: int = 1, g: int = 1, mn: int = 1, ready: int | None = 1, proposed: int | None = None, **counts: int) -> RoleFacts:
    return RoleFacts(watts_per_replica=w, gpus_per_replica=g, min_replicas=mn, ready=ready, proposed=proposed, **counts)


def effective(out_targets: dict[str, int | None], roles: dict[str, RoleFacts]) -> dict[str, int]:
    return {r: roles[r].charged if t is None else t for r, t in out_targets.items()}


# --- the planner ------------------------------------------------------------------------


def test_a_scale_up_stops_at_the_gpus_that_exist():
    roles = {"prefill": R(), "decode": R(proposed=10)}
    out = plan(roles, Budget(BIG, capacity_gpus=6))
    assert out.targets == {"prefill": None, "decode": 5} and out.gpus == 6
    assert out.reasons == (Reason.GPU_CAPACITY.value,)
    assert plan(roles, Budget(BIG)).targets["decode"] == 10  # without the ceiling: beyond the GPUs


def test_a_ceiling_below_what_is_held_holds_and_never_shrinks():
    # decode holds 7 (two of them unplaced): the nodes can take only 5 GPUs of this deployment
    out = plan({"prefill": R(), "decode": R(ready=7, proposed=9)}, Budget(BIG, capacity_gpus=5))
    assert out.targets == {"prefill": None, "decode": None} and out.held == {"decode"}
    assert Reason.GPU_CAPACITY in out.reasons and out.gpus == 8
    # a proposed scale-down still goes; what it frees goes to the replicas already waiting for GPUs
    out = plan({"prefill": R(ready=3, proposed=1), "decode": R(ready=7, proposed=9)}, Budget(BIG, capacity_gpus=5))
    assert out.targets == {"prefill": 1, "decode": None} and out.gpus == 8


def test_a_rebalance_whose_transition_needs_gpus_not_there_is_staged():
    # the demo's shape: 2-GPU replicas, (2, 2) proposed (1, 18), 16 GPUs free beyond the 8 held
    roles = {"prefill": R(g=2, ready=2, proposed=1), "decode": R(g=2, ready=2, proposed=18)}
    out = plan(roles, Budget(BIG, capacity_gpus=24))
    assert out.targets == {"prefill": 1, "decode": None}
    assert out.staged_goal == {"prefill": 1, "decode": 11}
    assert Reason.GPU_CAPACITY in out.reasons and Reason.GPU_STAGED in out.reasons


def test_the_plan_contract_takes_the_capacity():
    roles = {"prefill": {"watts_per_replica": 100, "gpus_per_replica": 1, "ready": 1},
             "decode": {"watts_per_replica": 100, "gpus_per_replica": 1, "ready": 1, "proposed": 10}}
    got = answer(json.dumps({"budget": {"power_limit_w": 5000, "capacity_gpus": 6}, "roles": roles}))
    assert got["targets"] == {"prefill": None, "decode": 5} and got["reasons"] == ["gpu_capacity"]
    assert answer(json.dumps({"budget": {"power_limit_w": 5000}, "roles": roles}))["targets"]["decode"] == 10
    assert "capacity_gpus" in answer(json.dumps({"budget": {"power_limit_w": 5000, "capacity_gpus": -2},
                                                 "roles": roles}))["error"]


@st.composite
def cases(draw):
    def role() -> RoleFacts:
        ready = draw(st.integers(0, 8))
        return RoleFacts(watts_per_replica=draw(st.integers(0, 50)), gpus_per_replica=draw(st.integers(0, 4)),
                         min_replicas=draw(st.integers(0, 2)), ready=ready,
                         proposed=draw(st.none() | st.integers(0, 14)), desired=draw(st.none() | st.integers(0, 9)),
                         pods=draw(st.none() | st.integers(0, 9)))
    roles = {"prefill": role(), "decode": role()}
    budget = Budget(draw(st.integers(0, 1500)), max_gpus=draw(st.sampled_from([-1, draw(st.integers(0, 40))])),
                    capacity_gpus=draw(st.integers(0, 40)))
    return roles, budget


@settings(max_examples=400, deadline=None)
@given(cases())
def test_never_more_gpus_than_the_capacity_and_never_a_shrink_for_it(case):
    roles, budget = case
    try:
        out = plan(roles, budget)
    except PlanError:
        assume(False)
        return
    g = {r: f.gpus_per_replica for r, f in roles.items()}
    for got in (effective(out.targets, roles), out.staged_goal or effective(out.targets, roles)):
        gpus = sum(got[r] * g[r] for r in roles)
        if gpus > budget.capacity_gpus:  # beyond the ceiling only what is held (or a minimum) already
            assert all(got[r] <= max(roles[r].charged, roles[r].min_replicas) for r in roles if g[r]), (got, out)
    charged_w = sum(f.charged * f.watts_per_replica for f in roles.values())
    charged_g = sum(f.charged * f.gpus_per_replica for f in roles.values())
    if charged_w <= budget.power_limit_w and (budget.max_gpus < 0 or charged_g <= budget.max_gpus):
        # what is held fits the other ceilings: nothing goes below min(held, proposal), the ceiling included
        eff = effective(out.targets, roles)
        for r, f in roles.items():
            if f.proposed is not None:
                assert eff[r] >= min(f.charged, max(f.proposed, f.min_replicas)), (r, eff, out)
            else:
                assert out.targets[r] is None


# --- the fleet's ceilings ---------------------------------------------------------------


def pod(node: str | None, gpus: int, phase: str = "Running") -> GpuPod:
    return GpuPod(name=f"p-{node}-{gpus}-{phase}", namespace="default", node_name=node, phase=phase, gpus=gpus)


def test_free_gpus_count_every_pod_that_holds_them():
    pods = [pod("a", 2), pod("a", 1, "Pending"), pod("a", 4, "Succeeded"), pod("b", 9), pod(None, 3, "Pending")]
    assert free_gpus({"a": 8, "b": 8, "c": None}, pods) == {"a": 5, "b": 0, "c": None}


def test_ceilings_share_the_room_count_whole_pods_and_skip_unknown_groups():
    free = {"a1": 3, "a2": 3, "b1": 8, "b2": None}
    group_nodes = {"rack-a": ["a1", "a2"], "rack-b": ["b1", "b2"]}
    needs = {"x": GpuNeed(charged=4, unplaced=0, wanted=20, pod_gpus=2),  # 2-GPU pods: 2 + 2 of the 6 free
             "y": GpuNeed(charged=2, unplaced=1, wanted=3, pod_gpus=1),  # one replica unplaced: 5 of 6 room
             "z": GpuNeed(charged=2, unplaced=0, wanted=9, pod_gpus=1)}
    got = gpu_ceilings(needs, {"x": {"rack-a"}, "y": {"rack-a"}, "z": {"rack-a", "rack-b"}}, group_nodes, free)
    # rack-a's room 6 - 1 unplaced = 5, split over wants x 16, y 1, z 7: y 1, x 2, z 2 (and x's pods need 2 GPUs each)
    assert got["y"] == 3 and got["x"] == 4 + 2 and "z" not in got  # z may land on rack-b, which reports no GPUs
    assert sum(got[k] - needs[k].charged for k in ("x", "y")) <= 5


@st.composite
def fleets(draw):
    nodes = {f"n{i}": draw(st.none() | st.integers(0, 8)) if i == 0 else draw(st.integers(0, 8)) for i in range(4)}
    group_nodes = {"g0": ["n0", "n1"], "g1": ["n2"], "g2": ["n3"]}
    needs, groups = {}, {}
    for k in ("x", "y", "z"):
        charged = draw(st.integers(0, 6))
        needs[k] = GpuNeed(charged=charged, unplaced=draw(st.integers(0, charged)), wanted=draw(st.integers(0, 20)),
                           pod_gpus=draw(st.integers(1, 3)))
        groups[k] = set(draw(st.lists(st.sampled_from(sorted(group_nodes)), max_size=3)))
    return needs, groups, group_nodes, nodes


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_the_grants_never_exceed_the_free_gpus_nor_fall_below_what_is_held(fleet):
    needs, groups, group_nodes, free = fleet
    got = gpu_ceilings(needs, groups, group_nodes, free)
    known = [g for g, ns in group_nodes.items() if all(free[n] is not None for n in ns)]
    room = {g: sum(free[n] for n in group_nodes[g]) - sum(needs[k].unplaced for k in needs if g in groups[k])
            for g in known}
    assert sum(c - needs[k].charged for k, c in got.items()) <= sum(max(0, r) for r in room.values())
    for k, c in got.items():
        assert groups[k] and set(groups[k]) <= set(known)  # a ceiling only where every group is known
        assert needs[k].charged <= c <= max(needs[k].charged, needs[k].wanted)
    assert set(got) == {k for k in needs if groups[k] and set(groups[k]) <= set(known)}
