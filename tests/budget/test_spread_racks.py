"""A deployment spread over several racks (issue 18 items 2 and 9): each rack is charged what is
physically on its nodes plus what may still land there, and any growth must fit whichever of the
deployment's racks gets it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.fleet import DeploymentView, fleet_ledger
from powerfleet.budget.groups import Footprint, allocate, allocate_racks
from powerfleet.budget.planner import Budget, RoleFacts, plan
from powerfleet.budget.program import DeploymentBudget, Snapshot, evaluate
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION, parse_dgd
from powerfleet.cluster.immutability import admit_power_inputs
from powerfleet.cluster.objects import PodInfo
from tests.budget.test_groups import members_st

RACK = "powerfleet.io/rack"
NODES = {"gpu-a": "rack-a", "gpu-b": "rack-b"}


def spread(name: str, placement: dict[str, list[str | None]], cap: int = 500) -> tuple[DeploymentView, Snapshot]:
    """A settled DGD whose role ``c`` has one 1-GPU pod per entry of ``placement[c]`` (a node, or
    None: Pending without a node)."""
    comps = [{"name": c, "type": c, "replicas": len(nodes), "podTemplate": {
        "metadata": {"annotations": {POWER_ANNOTATION: str(cap)}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
        for c, nodes in placement.items()]
    status = {"observedGeneration": 1, "rollingUpdate": {"phase": "Completed"}, "components": {
        c: {"replicas": len(n), "readyReplicas": len(n), "updatedReplicas": len(n), "rollout": {"phase": "Completed"}}
        for c, n in placement.items()}}
    dgd = parse_dgd({"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
                     "metadata": {"name": name, "namespace": "default", "generation": 1},
                     "spec": {"components": comps}, "status": status})
    pods = [PodInfo(name=f"{name}-{c}-{i}", namespace="default", node_name=node,
                    phase="Running" if node else "Pending", labels={LABEL_DGD_NAME: name, LABEL_COMPONENT: c},
                    annotations={POWER_ANNOTATION: str(cap)})
            for c, nodes in placement.items() for i, node in enumerate(nodes)]
    admitted, budget = admit_power_inputs(dgd), DeploymentBudget(power_limit_w=100_000)
    view = DeploymentView(key=f"default/{name}", dgd=dgd, admitted=admitted, budget=budget,
                          proposal={"decode": 6}, pods=pods)
    return view, Snapshot(dgd=dgd, pods=pods, budget=budget, admitted=admitted, proposal={"decode": 6},
                          now="2026-12-01T12:00:00Z")


def test_a_deployment_spread_over_two_racks_is_not_over_its_allowance_when_each_rack_fits():
    # the demo's shape: 6 pods at 500 W (3,000 W), half on each rack; each rack's limit is 2,000 W
    view, snap = spread("llm", {"prefill": ["gpu-a", "gpu-b"], "decode": ["gpu-a", "gpu-b", "gpu-a", "gpu-b"]})
    ledger = fleet_ledger([view], NODES, {"rack-a": 2000, "rack-b": 2000}, RACK)
    # each rack is charged what is on it (1,500 W), not the whole 3,000 W
    assert ledger.projected_w == {"rack-a": 1500, "rack-b": 1500}
    gl = ledger.limits["default/llm"]
    assert gl.group == "rack-a,rack-b" and gl.current_w == 3000
    # growth may land on either rack: it gets the 500 W each one has free, not 1,000 W
    assert gl.limit_w == 3500 and ledger.peak_w == {"rack-a": 2000, "rack-b": 2000}
    res = evaluate(replace(snap, group=gl))
    assert "overBudgetWatts" not in res.status, res.status
    assert res.status["powerLimitWatts"] == 3500 and res.replicas == {"decode": 5}  # one more replica, not two
    assert not any(e.reason == "OverBudget" for e in res.status_events)


def test_a_pending_pod_without_a_node_is_charged_to_every_rack_the_deployment_may_land_on():
    view, _ = spread("llm", {"prefill": ["gpu-a"], "decode": ["gpu-b", None]})
    ledger = fleet_ledger([view], NODES, {"rack-a": 5000, "rack-b": 5000}, RACK)
    assert ledger.projected_w == {"rack-a": 500 + 500, "rack-b": 500 + 500}
    assert ledger.limits["default/llm"].current_w == 1500


def test_a_deployment_on_one_rack_gets_the_single_group_rule():
    view, _ = spread("llm", {"prefill": ["gpu-a"], "decode": ["gpu-a", "gpu-a"]})
    ledger = fleet_ledger([view], NODES, {"rack-a": 2500, "rack-b": 2500}, RACK)
    assert ledger.projected_w == {"rack-a": 1500, "rack-b": 0}
    assert ledger.limits["default/llm"].group == "rack-a" and ledger.limits["default/llm"].limit_w == 2500


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 30_000), members_st)
def test_deployments_wholly_on_one_group_get_exactly_the_single_group_allowance(budget, members):
    members = {k: replace(m, remote=False) for k, m in members.items()}  # each holds its pods there
    single = allocate(budget, members)
    prints = {k: Footprint(m.minimum_w, m.demand_w, m.current_w, m.own_limit_w, {"g": m.current_w})
              for k, m in members.items()}
    racks = allocate_racks({"g": budget}, prints, {k: {"g"} for k in members})
    assert racks.limits == {k: a.limit_w for k, a in single.allowances.items()}


@st.composite
def fleets(draw):
    """Racks with tenants; deployments of two roles whose charged replicas each sit on one of the
    deployment's racks or on none yet (unplaced), with a proposal or none per role."""
    racks = [f"r{i}" for i in range(draw(st.integers(1, 4)))]
    tenants = {r: draw(st.integers(0, 2000)) for r in racks}
    deployments = {}
    for d in range(draw(st.integers(1, 4))):
        mine = draw(st.lists(st.sampled_from(racks), min_size=1, max_size=len(racks), unique=True))
        roles = {}
        for role in ("prefill", "decode"):
            w, charged = draw(st.integers(100, 1200)), draw(st.integers(1, 5))
            where = draw(st.lists(st.sampled_from([*mine, None]), min_size=charged, max_size=charged))
            roles[role] = (RoleFacts(watts_per_replica=w, gpus_per_replica=1, ready=charged,
                                     proposed=draw(st.none() | st.integers(0, 9))), where)
        deployments[f"d{d}"] = (mine, roles, draw(st.integers(0, 20_000)))
    headroom = {r: draw(st.integers(0, 4000)) for r in racks}
    landing = {k: draw(st.sampled_from(mine)) for k, (mine, _, _) in deployments.items()}
    return racks, tenants, deployments, headroom, landing


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_no_rack_is_over_its_limit_after_any_plan_wherever_the_scale_ups_land(fleet):
    racks, tenants, deployments, headroom, landing = fleet
    prints: dict[str, Footprint] = {}
    for k, (mine, roles, own) in deployments.items():
        placed = {r: sum(f.watts_per_replica for f, where in roles.values() for n in where if n == r) for r in mine}
        unplaced = sum(f.watts_per_replica for f, where in roles.values() for n in where if n is None)
        current = sum(f.charged * f.watts_per_replica for f, _ in roles.values())
        prints[k] = Footprint(minimum_w=sum(f.watts_per_replica for f, _ in roles.values()),
                              demand_w=sum((f.proposed if f.proposed is not None else f.charged) * f.watts_per_replica
                                           for f, _ in roles.values()),
                              current_w=current, own_limit_w=max(own, current), placed_w=placed, unplaced_w=unplaced)
    groups = {k: set(mine) for k, (mine, _, _) in deployments.items()}
    # every rack fits now: its limit is its projected watts plus some headroom
    projected = {r: tenants[r] + sum(f.on(r) for k, f in prints.items() if r in groups[k]) for r in racks}
    budgets = {r: projected[r] + headroom[r] for r in racks}
    got = allocate_racks(budgets, prints, groups, tenants)
    assert got.projected_w == projected
    physical = {r: tenants[r] + sum(f.placed_w.get(r, 0) for f in prints.values()) for r in racks}
    for k, (_, roles, _) in deployments.items():
        f = prints[k]
        limit = got.limits[k]
        facts = {role: rf for role, (rf, _) in roles.items()}
        if limit < f.minimum_w:  # as the program does: shrink toward the minimum, grow nothing
            facts = {role: replace(rf, rolling=True) for role, rf in facts.items()}
        p = plan(facts, Budget(max(limit, f.minimum_w)))
        # the transition: every existing pod stays, every new one lands on the adversary's rack
        grown = sum(max(0, (t if t is not None else facts[r].charged) - facts[r].charged) * facts[r].watts_per_replica
                    for r, t in p.targets.items())
        assert grown <= max(0, limit - f.current_w)
        physical[landing[k]] += f.unplaced_w + grown
    over = {r: (physical[r], budgets[r]) for r in racks if physical[r] > budgets[r]}
    assert not over, over
    assert all(physical[r] <= got.peak_w[r] for r in racks)


def test_a_deployment_over_its_share_on_one_rack_keeps_no_more_than_that_share_wherever_it_shrinks():
    # found by the exploration (src/powerfleet/testing/budget/explore_machine.py): d0 held 3,000 W on r1 and 2,000 W on
    # r2 and was over its share of r1 (1,000 W); it was given 5,000 - 2,000 = 3,000 W, the operator
    # removed its pods on r2, and r1 stayed at 5,300 W on 4,000 once settled
    prints = {"d0": Footprint(1000, 3000, 5000, 20_000, {"r1": 3000, "r2": 2000}),
              "d4": Footprint(1000, 2000, 2000, 20_000, {"r1": 2000})}
    racks = allocate_racks({"r1": 4000, "r2": 8000}, prints, {"d0": {"r1", "r2"}, "d4": {"r1"}}, {"r1": 300})
    assert racks.limits["d0"] == 1000, racks.limits
    # every pod it keeps on r1, the worst the operator can do: r1 fits
    assert min(racks.limits["d0"], 3000) + racks.limits["d4"] + 300 <= 4000, racks.limits
