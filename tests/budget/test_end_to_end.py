"""End to end: real Redis, a real control worker process, the loopback API server.

Two deployments share rack-a (budget 4000 W; every replica is 1 GPU x 500 W):
alpha runs (1 prefill, 3 decode) = 2000 W, beta (1, 1) = 1000 W. alpha is proposed (6, 1):
3500 W, more than its fair share (3000 W), so it is clamped to (5, 1); and (1, 3) -> (5, 1) is an
opposing rebalance whose peak (5, 3) = 4000 W exceeds that share, so it is staged: decode goes
down at the first evaluation, prefill up at the second. Then beta's cap annotation changes after
admission: beta fails closed, alpha keeps running; once rolled out and re-admitted, beta is planned again.
"""

from __future__ import annotations

import json

import pytest

from tests.budget.conftest import RACK_A_NODES
from powerfleet.testing.budget.stand_in_operator import budget_status, dgd, replicas, settle
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
NODES = RACK_A_NODES


def test_group_budget_clamps_stages_and_fails_one_deployment_closed(rack_a, launcher, app):
    api, kube, kubeconfig = rack_a
    api.apply(dgd("alpha", 1, 3))
    api.apply(dgd("beta", 1, 1))
    for name in ("alpha", "beta"):
        settle(api, kube, name, NODES)
    launcher.env.update({
        "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
        "POWERFLEET_BUDGET__GROUPS": json.dumps({"rack-a": 4000}),
        "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({"default/alpha": {"power_limit_w": 4000},
                                                      "default/beta": {"power_limit_w": 4000}}),
    })
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@budget", "--concurrency", "2")
    wait_worker(app, "ctl@budget")

    def call(task: str, **kwargs):
        return app.send_task(f"powerfleet.budget.{task}", kwargs=kwargs).get(timeout=60)

    def tick_and_wait(what: str, probe):
        assert sorted(call("tick")["evaluations"]) == ["default/alpha", "default/beta"]
        return wait_for(probe, what, timeout_s=60)

    # The proposal survives in Redis (last writer wins): a first, smaller one is replaced.
    call("propose", deployment="default/alpha", replicas={"prefill": 2})
    assert call("propose", deployment="default/alpha", replicas={"prefill": 6, "decode": 1})["replicas"] == {"prefill": 6, "decode": 1}

    # Evaluation 1: admitted from the settled snapshot; clamped to (5, 1); staged: decode down only.
    st = tick_and_wait("alpha's staged first step", lambda: budget_status(api, "alpha").get("reasons") and budget_status(api, "alpha"))
    assert st["reasons"] == ["power_budget_clamped", "power_rebalance_staged"] and st["ready"] == "True"
    assert st["targets"] == {"decode": 1} and st["held"] == ["prefill"] and st["powerLimitWatts"] == 3000
    assert replicas(api, "alpha") == {"prefill": 1, "decode": 1}
    wait_for(lambda: budget_status(api, "beta").get("reason") == "Planned", "beta admitted")
    assert replicas(api, "beta") == {"prefill": 1, "decode": 1}

    # The operator finishes scaling decode down; evaluation 2 brings prefill up into the freed watts.
    settle(api, kube, "alpha", NODES)
    st = tick_and_wait("alpha's second step", lambda: budget_status(api, "alpha").get("targets") == {"prefill": 5, "decode": 1}
                       and budget_status(api, "alpha"))
    assert replicas(api, "alpha") == {"prefill": 5, "decode": 1}
    assert st["reasons"] == ["power_budget_clamped"] and st["held"] == []
    assert st["settledWatts"] == st["peakWatts"] == 3000
    settle(api, kube, "alpha", NODES)
    wait_for(lambda: {"Planned", "PowerInputsAdmitted"} <= {e.reason for e in kube.list_events(
        "default", involved_name="alpha")}, "alpha's events")
    assert st["lastScale"]["changes"] == ["prefill replicas 1 -> 5 (prefill)"], st  # a scale's record

    # beta's cap changes after admission: beta fails closed, alpha keeps running.
    changed = api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "beta")
    decode = next(c for c in changed["spec"]["components"] if c["name"] == "decode")  # by name: the list order is not kept
    decode["podTemplate"]["metadata"]["annotations"]["dynamo.nvidia.com/gpu-power-limit"] = "400"
    api.apply(changed)
    call("propose", deployment="default/beta", replicas={"decode": 2})
    st = tick_and_wait("beta failing closed", lambda: budget_status(api, "beta").get("reason") == "PowerInputsChanged"
                       and budget_status(api, "beta"))
    assert st["ready"] == "False" and "'500' -> '400'" in st["message"]
    assert replicas(api, "beta") == {"prefill": 1, "decode": 1}
    alpha = budget_status(api, "alpha")
    assert alpha["ready"] == "True" and alpha["reason"] == "Planned" and replicas(api, "alpha") == {"prefill": 5, "decode": 1}
    # the event follows the status write that made the transition
    wait_for(lambda: ("PowerInputsChanged", "Warning") in [(e.reason, e.type) for e in
                                                           kube.list_events("default", involved_name="beta")],
             "beta's PowerInputsChanged warning event")

    # Re-admission: once the operator has rolled beta out at 400 W, readmit; the next tick admits the
    # new caps from the settled snapshot and plans beta again.
    settle(api, kube, "beta", NODES)
    assert call("readmit", deployment="default/beta") == {"deployment": "default/beta", "forgot": True}
    st = tick_and_wait("beta re-admitted", lambda: budget_status(api, "beta").get("reason") == "Planned"
                       and budget_status(api, "beta"))
    assert st["ready"] == "True"
    wait_for(lambda: any(e.reason == "PowerInputsAdmitted" and "decode=400W/GPU" in e.message
                         for e in kube.list_events("default", involved_name="beta")), "beta's new caps admitted")
