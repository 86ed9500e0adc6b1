"""End to end on a rack with an unmanaged tenant and an in-flight scale-up (issue 18): real Redis,
a real control worker, the loopback API server. At every step a rack's projected watts are
computed independently, from every pod on its nodes (Pending and Terminating ones too) and every
deployment's desired count, and are never above the rack's budget.

rack-a (5,000 W, nodes gpu-a1 and gpu-a2) holds a tenant pod with 2 GPUs and no cap (charged
2 x 1,000 W, the maximum settable limit) and deployment alpha (1 prefill, 1 decode; 1 GPU x 500 W
per replica). alpha is proposed decode 6: only 2,000 W are free, so decode goes to 5. While decode's
new replicas start (spec 5, ready 1) a proposal for more prefill is held. Once they are ready,
the rack is full: nothing more grows.
"""

from __future__ import annotations

import json

import pytest

from powerfleet.cluster.dgd import LABEL_DGD_NAME, POWER_ANNOTATION, parse_dgd
from powerfleet.twin.apiserver import ApiServer
from tests.budget.conftest import RACK_A_NODES
from tests.budget.stand_in_operator import budget_status, dgd, replicas, settle, start_rollout
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
NODES = RACK_A_NODES
BUDGET_W = 5000
MAX_SETTABLE_W = 1000


def projected_rack_watts(api: ApiServer) -> int:
    """Independently of powerfleet: each pod on the rack's nodes that is not finished, at its
    annotation's cap x GPUs (1 GPU per deployment pod here) or, without one, the maximum settable
    limit per GPU; and each deployment at its desired count where more than its pods."""
    watts = 0
    pods = [p for p in api.list("v1", "Pod") if p["spec"].get("nodeName") in NODES
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
    per_dgd: dict[str, dict[str, int]] = {}
    for p in pods:
        gpus = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                   for c in p["spec"]["containers"])
        cap = p["metadata"].get("annotations", {}).get(POWER_ANNOTATION)
        dgd_name = p["metadata"].get("labels", {}).get(LABEL_DGD_NAME)
        if dgd_name:
            comp = p["metadata"]["labels"]["nvidia.com/dynamo-component"]
            per_dgd.setdefault(dgd_name, {}).setdefault(comp, 0)
            per_dgd[dgd_name][comp] += 1
        else:
            watts += gpus * (int(cap) if cap else MAX_SETTABLE_W)
    for name, comps in per_dgd.items():
        d = parse_dgd(api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", name))
        for c in d.components:
            if c.name != "Frontend":
                watts += max(c.replicas, comps.get(c.name, 0)) * 500
    return watts


def test_a_rack_with_a_tenant_and_an_in_flight_scale_up_never_projects_above_its_budget(rack_a, launcher, app):
    api, kube, kubeconfig = rack_a
    api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tenant-job", "namespace": "other"},
               "spec": {"nodeName": "gpu-a2", "containers": [{"name": "main", "resources": {
                   "limits": {"nvidia.com/gpu": "2"}}}]}, "status": {"phase": "Running"}})
    api.apply(dgd("alpha", 1, 1))
    settle(api, kube, "alpha", NODES)
    launcher.env.update({
        "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
        "POWERFLEET_BUDGET__GROUPS": json.dumps({"rack-a": BUDGET_W}),
        "POWERFLEET_BUDGET__MAX_SETTABLE_GPU_W": str(MAX_SETTABLE_W),
        "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({"default/alpha": {"power_limit_w": 10_000}}),
    })
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@rack", "--concurrency", "1")
    wait_worker(app, "ctl@rack")

    def call(task: str, **kwargs):
        return app.send_task(f"powerfleet.budget.{task}", kwargs=kwargs).get(timeout=60)

    def tick_and_wait(what: str, probe):
        assert call("tick")["evaluations"] == ["default/alpha"]
        got = wait_for(probe, what, timeout_s=60)
        assert projected_rack_watts(api) <= BUDGET_W, what
        return got

    assert projected_rack_watts(api) == 2000 + 1000
    call("propose", deployment="default/alpha", replicas={"decode": 6})
    st = tick_and_wait("alpha admitted and clamped", lambda: budget_status(api, "alpha").get("targets")
                       and budget_status(api, "alpha"))
    # 5,000 - 2,000 (tenant) = 3,000 W for alpha: 1 prefill + 5 decode
    assert st["targets"] == {"decode": 5} and st["powerLimitWatts"] == 3000 and replicas(api, "alpha")["decode"] == 5
    assert projected_rack_watts(api) == 2000 + 6 * 500

    start_rollout(api, kube, "alpha", NODES)  # decode's 4 new pods are starting; 1 ready
    assert projected_rack_watts(api) <= BUDGET_W
    call("propose", deployment="default/alpha", replicas={"decode": 5, "prefill": 3})
    st = tick_and_wait("prefill held while decode is in flight", lambda: (s := budget_status(api, "alpha")).get(
        "held") == ["prefill"] and s)
    assert st["rolling"] and replicas(api, "alpha") == {"prefill": 1, "decode": 5}

    settle(api, kube, "alpha", NODES)  # ready: the rack is full, so prefill still does not grow
    st = tick_and_wait("the rack full", lambda: not (s := budget_status(api, "alpha")).get("rolling") and s)
    assert replicas(api, "alpha") == {"prefill": 1, "decode": 5} and st["settledWatts"] == 3000
    assert projected_rack_watts(api) == BUDGET_W
