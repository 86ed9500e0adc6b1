"""The ledger on the faithful twin (issue 18, Tests): real Redis, a real control worker, and the
twin's own operator (twin/cluster/writer.py) over the loopback API server, which prunes DGD status as a
real server does. Pods start after a startup delay, deleted pods stay Terminating (holding their
GPUs) for their grace period, each rack carries an unmanaged tenant with a cap and one without,
and llm-agg's worker is owned by a Dynamo scaling adapter (powerfleet scales it through it).

A scenario with an in-flight scale-up and a tenant: llm-disagg is proposed a rebalance towards
decode far beyond its racks, and while its new pods start llm-agg is proposed more workers. At
every step (after each operator pass and after each round of evaluations) each rack's projected
watts are computed independently, from every pod on its nodes, Terminating ones included, and are
never above the rack's limit; the projected watts each tick records per rack (its ledger) are never
below them, never above the limit, and above them only by replicas that hold no node yet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from celery.result import AsyncResult

from powerfleet.budget.state import BudgetState
from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import GPU_RESOURCE, POWER_ANNOTATION
from powerfleet.twin.cluster.adapters import ADAPTER_KIND, adapter_name
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.fidelity import OperatorSettings
from powerfleet.twin.cluster.manifests import AGG, DISAGG, dgd_manifests
from powerfleet.twin.cluster.tenants import TENANT_LABEL, tenant_pods
from powerfleet.twin.cluster.topology import GPU_MAX_W, RACK_LABEL, TwinSpec, node_objects
from powerfleet.twin.cluster.writer import OperatorLoop
from powerfleet.testing.budget.stand_in_operator import budget_status
from tests.integration.conftest import wait_worker

pytestmark = pytest.mark.integration
SPEC = TwinSpec(nodes=2)  # rack-a: twin-gpu-00, rack-b: twin-gpu-01; 8 GPUs each
SETTINGS = OperatorSettings(startup_delay_s={"prefill": 3.0, "decode": 3.0, "worker": 3.0, "*": 1.0},
                            termination_grace_s=4)
HEADROOM_W = 1800  # each rack's limit: what is physically on it at the start plus this


def pod_watts(p: dict) -> int:
    """A pod at its annotation's cap, or the GPU's maximum settable limit without one, times the
    GPUs its containers request."""
    gpus = sum(int((c.get("resources") or {}).get("limits", {}).get(GPU_RESOURCE, 0)) for c in p["spec"]["containers"])
    cap = (p["metadata"].get("annotations") or {}).get(POWER_ANNOTATION)
    return gpus * (int(cap) if cap else GPU_MAX_W)


def rack_watts(api: ApiServer) -> dict[str, int]:
    """Independently of powerfleet, per rack: every pod bound to one of its nodes that is not
    finished (Pending, Running, Terminating), at its charge."""
    racks = {n["metadata"]["name"]: n["metadata"]["labels"][RACK_LABEL] for n in api.list("v1", "Node")}
    on_rack = {r: 0 for r in racks.values()}
    for p in api.list("v1", "Pod"):
        rack = racks.get(p["spec"].get("nodeName"))
        if rack is not None and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            on_rack[rack] += pod_watts(p)
    return on_rack


def test_no_rack_projects_above_its_limit_at_any_step_on_the_faithful_twin(tmp_path: Path, launcher, app, broker_url):
    clock = FakeClock(1_000_000.0)
    api = ApiServer(clock=clock).start()
    loop = None
    try:
        for obj in (node_objects(SPEC) + tenant_pods(SPEC)
                    + dgd_manifests(SPEC, scaling_adapters=((AGG, "frontend"), (AGG, "worker")))):
            api.apply(obj)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        loop = OperatorLoop(str(kubeconfig), clock=clock, settings=SETTINGS)
        steps: list[dict[str, int]] = []
        ledger: list[tuple[dict[str, int], dict[str, int]]] = []  # (the tick's projected, physical then)
        terminating_seen: set[str] = set()

        def operator_pass() -> None:
            clock.advance(1.0)
            result = loop.run_once()
            assert not result.errors, result.errors
            steps.append(rack_watts(api))
            terminating_seen.update(p["metadata"]["name"] for p in api.list("v1", "Pod")
                                    if p["metadata"].get("deletionTimestamp"))

        for _ in range(6):  # everything scheduled, started and Ready
            operator_pass()
        limits = {r: w + HEADROOM_W for r, w in steps[-1].items()}
        launcher.env.update({
            "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
            "POWERFLEET_BUDGET__GROUP_LABEL": RACK_LABEL,
            "POWERFLEET_BUDGET__GROUPS": json.dumps(limits),
            "POWERFLEET_BUDGET__MAX_SETTABLE_GPU_W": str(GPU_MAX_W),
            # the twin's planner components write no replicas: powerfleet is their sole writer
            "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({f"default/{d}": {"power_limit_w": 100_000, "sole_writer": True}
                                                          for d in (DISAGG, AGG)}),
        })
        launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@twin", "--concurrency", "1")
        wait_worker(app, "ctl@twin")

        def budget_round() -> None:
            tick = app.send_task("powerfleet.budget.tick").get(timeout=60)
            assert sorted(tick["evaluations"]) == [f"default/{AGG}", f"default/{DISAGG}"], tick
            for task_id in tick["task_ids"].values():
                AsyncResult(task_id, app=app).get(timeout=60)
            steps.append(rack_watts(api))  # the evaluations write counts, not pods: as at the tick
            recorded = BudgetState(redis.Redis.from_url(broker_url)).group_history()[-1]["groups"]
            ledger.append(({r: f["projected_w"] for r, f in recorded.items()}, steps[-1]))

        def propose(dgd: str, replicas: dict[str, int]) -> None:
            app.send_task("powerfleet.budget.propose", kwargs={"deployment": f"default/{dgd}",
                                                               "replicas": replicas}).get(timeout=30)

        budget_round()  # admission from the settled twin
        assert budget_status(api, DISAGG)["reason"] == "Planned", budget_status(api, DISAGG)
        propose(DISAGG, {"prefill": 1, "decode": 8})  # one prefill less, decode far beyond the racks
        disagg_seen, agg_seen, reasons_seen = set(), set(), set()
        for step in range(20):
            budget_round()
            operator_pass()
            if step == 2:  # decode's new pods are starting: another deployment asks to grow
                propose(AGG, {"worker": 6})
            d = {c: s["replicas"] for c, s in api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", DISAGG)
                 ["spec"]["services"].items()}
            disagg_seen.add((d["prefill"], d["decode"]))
            reasons_seen.update(r for dgd in (DISAGG, AGG) for r in budget_status(api, dgd).get("reasons", []))
            agg_seen.add(api.get("nvidia.com/v1beta1", ADAPTER_KIND, adapter_name(AGG, "worker"))["spec"]["replicas"])

        # Settled: neither the operator nor powerfleet writes the DGD again. The operator keeps
        # powerfleet's condition (as Dynamo's does), so powerfleet does not re-add it each time.
        def dgd_version() -> str:
            return api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", DISAGG)["metadata"]["resourceVersion"]
        before = dgd_version()
        budget_round()
        operator_pass()
        assert dgd_version() == before
        conditions = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", DISAGG)["status"]["conditions"]
        assert [c["type"] for c in conditions] == ["Ready", "powerfleet.io/PowerBudget"], conditions
        over = [(i, r, w, limits[r]) for i, on in enumerate(steps) for r, w in on.items() if w > limits[r]]
        assert not over, over
        # the ledger a tick records per rack is never below what is physically on the rack (it is
        # conservative), never above the limit, and above the physical watts only by replicas that
        # hold no node yet (at most one decode replica of 900 W per deployment here)
        print("ledger (projected, physical) per tick:", ledger)
        assert all(phys[r] <= proj[r] <= limits[r] and proj[r] - phys[r] <= 2 * 900
                   for proj, phys in ledger for r in limits), (ledger, limits)
        # not vacuous: decode grew but stayed below its proposal, a prefill pod went through
        # Terminating, llm-agg grew through its adapter, and a rack came within one decode
        # replica (900 W) of its limit
        decode_max = max(dec for _, dec in disagg_seen)
        assert 1 < decode_max < 8 and any(pre == 1 for pre, _ in disagg_seen), disagg_seen
        assert max(agg_seen) > 2, agg_seen
        # the in-flight scale-ups held the next ones until their pods were Ready; the rebalance was
        # staged (its transition over the watts, or over the GPUs the nodes have: budget/capacity.py)
        assert {"rollout_scale_up_held", "power_budget_clamped"} <= reasons_seen, reasons_seen
        assert reasons_seen & {"power_rebalance_staged", "gpu_rebalance_staged"}, reasons_seen
        # and nothing was planned beyond the GPUs: every pod of the fleet's DGDs got a node (the
        # Pending tenant, twin/cluster/tenants.py, waits for a pool no node is in)
        assert not [p["metadata"]["name"] for p in api.list("v1", "Pod") if not p["spec"].get("nodeName")
                    and TENANT_LABEL not in p["metadata"].get("labels", {})]
        # the growth stopped at a limit: a rack came within one decode replica of its watts, or (on
        # the twin's 16 GPUs, before the watts) at the GPUs the nodes have free (budget/capacity.py)
        assert "gpu_capacity" in reasons_seen or any(w > limits[r] - 900 for proj, _ in ledger
                                                     for r, w in proj.items()), (ledger, limits, reasons_seen)
        status = budget_status(api, DISAGG)
        assert status["reason"] == "Planned" and any(r.startswith("power_") or r == "gpu_capacity"
                                                     for r in status["reasons"]), status
        assert terminating_seen, "no pod was ever Terminating"
        assert any(TENANT_LABEL in (p["metadata"].get("labels") or {}) for p in api.list("v1", "Pod"))
    finally:
        if loop is not None:
            loop.stop()
        api.stop()
