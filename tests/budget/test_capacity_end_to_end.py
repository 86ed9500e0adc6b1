"""End to end: the budget stops a scale-up at the GPUs the nodes have free (real Redis, a real control
worker, the loopback API server whose Node reports ``status.allocatable["nvidia.com/gpu"]``).

One node, 6 allocatable GPUs, in rack-a; a tenant pod holds 2 of them; "llama" runs (1 prefill,
1 decode) with 1 GPU per pod. The watts fit 11 decode replicas, the GPUs only 3: decode is
proposed 10 and planned 3 (``gpu_capacity``), and once those are placed the next evaluation holds
it there (no shrink, no Pending pod).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from powerfleet.testing.budget.stand_in_operator import budget_status, dgd, replicas, settle
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
NODE = "gpu-a1"


@pytest.fixture
def one_node(tmp_path: Path):
    with ApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = KubeCluster.from_kubeconfig(str(kubeconfig))
        api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"powerfleet.io/rack": "rack-a"}},
                   "status": {"allocatable": {"nvidia.com/gpu": "6", "cpu": "64"}}})
        api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tenant", "namespace": "default"},
                   "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "train", "resources": {
                       "limits": {"nvidia.com/gpu": "2"}}}]}, "status": {"phase": "Running"}})
        yield api, kube, kubeconfig
        kube.close()


def test_a_scale_up_stops_at_the_free_gpus_and_holds_there(one_node, launcher, app):
    api, kube, kubeconfig = one_node
    api.apply(dgd("llama", 1, 1))
    settle(api, kube, "llama", [NODE], with_gpus=True)
    launcher.env.update({
        "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
        "POWERFLEET_BUDGET__GROUPS": json.dumps({"rack-a": 100_000}),
        "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({"default/llama": {"power_limit_w": 6_000}}),
    })
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@capacity", "--concurrency", "1")
    wait_worker(app, "ctl@capacity")

    def call(task: str, **kwargs):
        return app.send_task(f"powerfleet.budget.{task}", kwargs=kwargs).get(timeout=60)

    call("propose", deployment="default/llama", replicas={"decode": 10})
    assert call("tick")["evaluations"] == ["default/llama"]
    st = wait_for(lambda: budget_status(api, "llama").get("reason") == "Planned" and budget_status(api, "llama"),
                  "llama planned", timeout_s=60)
    # 6 GPUs - the tenant's 2 = 4 for llama: (1 prefill, 3 decode); watts alone would allow 10
    assert st["targets"] == {"decode": 3} and st["reasons"] == ["gpu_capacity"] and st["gpuCapacity"] == 4
    assert replicas(api, "llama") == {"prefill": 1, "decode": 3} and st["gpus"] == 4

    # placed: every GPU of the node is taken; the proposal stands, the next evaluation holds
    settle(api, kube, "llama", [NODE], with_gpus=True)
    call("tick")
    st = wait_for(lambda: (s := budget_status(api, "llama")).get("held") == ["decode"] and s, "decode held", timeout_s=60)
    assert st["targets"] == {} and st["reasons"] == ["gpu_capacity"] and st["gpuCapacity"] == 4
    assert replicas(api, "llama") == {"prefill": 1, "decode": 3}
