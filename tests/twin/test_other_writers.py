"""Other writers of replicas and other tenants, through the official client against the loopback
server: Dynamo's scaling adapter owns replicas, a stand-in planner rewrites them on its schedule,
and GPU pods the fleet does not manage share the racks. An injected clock, no sleeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.settlement import partition_pods
from powerfleet.twin.cluster.adapters import ADAPTER_PLURAL
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.cluster.manifests import AGG, dgd_manifests
from powerfleet.twin.cluster.operator import pod_gpus
from powerfleet.twin.cluster.planner import StandInPlanner
from powerfleet.twin.cluster.tenants import TENANT_LABEL, tenant_pods
from powerfleet.twin.cluster.topology import TwinSpec, node_objects
from powerfleet.twin.cluster.writer import OperatorLoop

SPEC = TwinSpec(nodes=2)


@pytest.fixture
def world(tmp_path: Path):
    def make(*, adapters=((AGG, "worker"),), planner: StandInPlanner | None = None, tenants: bool = False):
        clock = FakeClock(1_000_000.0)
        api = ApiServer(clock=clock).start()
        for obj in node_objects(SPEC) + dgd_manifests(SPEC, scaling_adapters=adapters) + (
                tenant_pods(SPEC) if tenants else []):
            api.apply(obj)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        loop = OperatorLoop(kubeconfig, clock=clock, planner=planner)
        kube = KubeCluster.from_kubeconfig(kubeconfig)
        made.append((api, loop, kube))
        return api, loop, kube, clock

    made: list = []
    yield make
    for api, loop, kube in made:
        kube.close()
        loop.stop()
        api.stop()


def _replicas(api: ApiServer, component: str = "worker") -> int:
    return api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", AGG)["spec"]["services"][component]["replicas"]


def test_the_scaling_adapter_owns_replicas_and_overwrites_direct_writes(world) -> None:
    api, loop, kube, _ = world()
    loop.run_once()
    adapter = api.get("nvidia.com/v1beta1", "DynamoGraphDeploymentScalingAdapter", "llm-agg-worker")
    assert adapter["spec"] == {"dgdRef": {"name": AGG, "serviceName": "worker"}, "replicas": 2}
    loop.run_once()
    adapter = api.get("nvidia.com/v1beta1", "DynamoGraphDeploymentScalingAdapter", "llm-agg-worker")
    assert adapter["status"]["replicas"] == 2 and "nvidia.com/dynamo-component=worker" in adapter["status"]["selector"]
    kube.patch_dgd_replicas("default", AGG, {"worker": 4})  # a direct write, as the budget makes one
    assert _replicas(api) == 4
    loop.run_once()
    assert _replicas(api) == 2 and loop.last_other_writes == ["adapter llm-agg/worker=2"]
    kube.custom.patch_namespaced_custom_object("nvidia.com", "v1beta1", "default", ADAPTER_PLURAL, "llm-agg-worker",
                                               {"spec": {"replicas": 3}})  # an autoscaler scales the adapter
    loop.run_once()
    assert _replicas(api) == 3


def test_the_stand_in_planner_rewrites_replicas_on_its_own_schedule(world) -> None:
    api, loop, kube, clock = world(adapters=(), planner=StandInPlanner(period_s=10.0))
    loop.run_once()  # it records what its model wants: the replicas it first sees
    kube.patch_dgd_replicas("default", AGG, {"worker": 4})
    clock.advance(5)
    loop.run_once()
    assert _replicas(api) == 4  # between its periods the other write stands
    clock.advance(6)
    loop.run_once()
    assert _replicas(api) == 2 and loop.last_other_writes == ["planner llm-agg/worker=2"]


def test_a_planner_scales_through_the_adapter_when_the_component_has_one(world) -> None:
    api, loop, _, clock = world(planner=StandInPlanner(period_s=10.0))
    loop.run_once()
    loop.custom.patch_namespaced_custom_object("nvidia.com", "v1beta1", "default", ADAPTER_PLURAL, "llm-agg-worker",
                                               {"spec": {"replicas": 5}})
    clock.advance(11)
    loop.run_once()  # the planner puts the adapter back to 2; the adapter sets the DGD
    loop.run_once()
    assert api.get("nvidia.com/v1beta1", "DynamoGraphDeploymentScalingAdapter", "llm-agg-worker")["spec"]["replicas"] == 2
    assert _replicas(api) == 2


def test_other_tenants_share_the_racks_and_their_gpus_are_never_given_to_a_dgd(world) -> None:
    api, loop, kube, _ = world(adapters=(), tenants=True)
    for _ in range(4):
        loop.run_once()
    pods = api.list("v1", "Pod")
    tenants = [p for p in pods if TENANT_LABEL in p["metadata"]["labels"]]
    # The Pending tenant (its pool label is on no node) stays unbound, as kube-scheduler leaves it.
    queued = [p for p in tenants if p["metadata"]["name"] == "queued-train"]
    assert len(queued) == 1 and not queued[0]["spec"].get("nodeName"), queued
    assert queued[0]["status"]["phase"] == "Pending" and {(c["type"], c["status"], c.get("reason")) for c in
                                                           queued[0]["status"]["conditions"]} == {
        ("PodScheduled", "False", "Unschedulable")}, queued
    tenants = [p for p in tenants if p not in queued]
    assert {p["spec"]["nodeName"] for p in tenants} == set(SPEC.node_names)  # one node per rack here
    assert sorted(POWER_ANNOTATION in p["metadata"]["annotations"] for p in tenants) == [False, False, True, True]
    used = [(p["spec"].get("nodeName"), g) for p in pods for g in pod_gpus(p)]
    assert len(used) == len(set(used))  # no GPU given twice
    node = SPEC.node_names[0]
    on_node = kube.list_pods("default", node_name=node)
    assert any(p.labels.get(TENANT_LABEL) == "train-job" and p.annotations.get(POWER_ANNOTATION) == "300" for p in on_node)
    dgd = kube.get_dgd("default", AGG)
    assert not any(TENANT_LABEL in p.labels for ps in partition_pods(dgd, on_node).values() for p in ps)
