"""Time in the twin, through the official client: graceful deletion holds a pod (and its GPUs)
for its grace period, then the operator's kubelet part removes it. An injected clock, no sleeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, RolloutPhase
from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.fidelity import OperatorSettings
from powerfleet.twin.cluster.manifests import AGG, dgd_manifests
from powerfleet.twin.cluster.operator import pod_gpus
from powerfleet.twin.cluster.topology import TwinSpec, node_objects
from powerfleet.twin.cluster.writer import OperatorLoop

SPEC = TwinSpec(nodes=2)


@pytest.fixture
def world(tmp_path: Path):
    clock = FakeClock(1_000_000.0)
    with ApiServer(clock=clock) as api:
        for obj in node_objects(SPEC) + dgd_manifests(SPEC):
            api.apply(obj)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        loop = OperatorLoop(kubeconfig, clock=clock, settings=OperatorSettings(termination_grace_s=30))
        kube = KubeCluster.from_kubeconfig(kubeconfig)
        try:
            yield api, loop, kube, clock
        finally:
            kube.close()
            loop.stop()


def _workers(api: ApiServer) -> list[dict]:
    return [p for p in api.list("v1", "Pod") if p["metadata"]["labels"].get(LABEL_DGD_NAME) == AGG
            and p["metadata"]["labels"].get(LABEL_COMPONENT) == "worker"]


def test_a_deleted_pod_stays_terminating_holding_its_gpus_for_the_grace_period(world) -> None:
    api, loop, kube, clock = world
    for _ in range(4):
        loop.run_once()
    victim = _workers(api)[0]
    name, node, gpus = victim["metadata"]["name"], victim["spec"]["nodeName"], pod_gpus(victim)
    loop.core.delete_namespaced_pod(name, "default")
    held = api.get("v1", "Pod", name)
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["deletionGracePeriodSeconds"] == 30
    assert held["status"]["phase"] == "Running"  # its processes still run
    assert [p.terminating for p in kube.list_pods("default", node_name=node) if p.name == name] == [True]
    clock.advance(10)
    loop.run_once()  # the operator replaces it, but the terminating pod keeps its GPUs
    replacement = [p for p in _workers(api) if p["metadata"]["name"] != name and not p["metadata"].get("deletionTimestamp")]
    assert len(replacement) == 2
    assert all(not (p["spec"].get("nodeName") == node and set(pod_gpus(p)) & set(gpus)) for p in replacement)
    loop.run_once()
    worker = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", AGG)["status"]["services"]["worker"]
    assert worker["replicas"] == 2  # non-terminated pods only: the terminating one is not a replica
    clock.advance(25)  # past the deadline: the kubelet's final delete
    loop.run_once()
    with pytest.raises(KeyError):
        api.store.bucket(api.registry.lookup("", "v1", "pods"))[("default", name)]
    # A second delete of an already-terminating pod cannot extend its deadline; grace 0 removes at once.
    other = _workers(api)[0]["metadata"]["name"]
    loop.core.delete_namespaced_pod(other, "default", grace_period_seconds=0)
    with pytest.raises(ApiException) as info:
        loop.core.read_namespaced_pod(other, "default")
    assert info.value.status == 404


def test_a_rollout_surges_and_new_pods_are_ready_only_after_their_startup_delay(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    with ApiServer(clock=clock) as api:
        for obj in node_objects(SPEC) + dgd_manifests(SPEC):
            api.apply(obj)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        loop = OperatorLoop(kubeconfig, clock=clock,
                            settings=OperatorSettings(startup_delay_s={"worker": 5.0}, termination_grace_s=0))
        kube = KubeCluster.from_kubeconfig(kubeconfig)
        try:
            for _ in range(3):
                loop.run_once()
                clock.advance(1)
            assert kube.get_dgd("default", AGG).status.components["worker"].ready_replicas == 0  # starting
            clock.advance(5)
            for _ in range(2):
                loop.run_once()
            assert kube.get_dgd("default", AGG).status.components["worker"].ready_replicas == 2
            kube.patch_dgd_replicas("default", AGG, {"worker": 3})  # a scale-up: spec 3, ready 2 meanwhile
            loop.run_once()
            loop.run_once()
            st = kube.get_dgd("default", AGG).status.components["worker"]
            assert (st.replicas, st.ready_replicas) == (3, 2)
            clock.advance(6)
            loop.run_once()
            svc = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", AGG)
            svc["spec"]["services"]["worker"]["extraPodMetadata"]["annotations"]["dynamo.nvidia.com/gpu-power-limit"] = "450"
            api.apply(svc)
            clock.advance(10)
            loop.run_once()  # the template changed: one surge pod beside the three old ones
            assert len(_workers(api)) == 4
            assert kube.get_dgd("default", AGG).status.rollout is RolloutPhase.IN_PROGRESS
        finally:
            kube.close()
            loop.stop()
