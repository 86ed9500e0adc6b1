"""Both DGD versions through the official client: discovery, reads, replica-only writes, nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.manifests import dgd_documents
from powerfleet.cluster.ports import Conflict, NotFound
from powerfleet.twin.apiserver import DEFAULT_RESOURCES, ApiServer, ResourceType

REAL = Path(__file__).parent / "fixtures" / "real"


def real(name: str) -> dict:
    [doc] = dgd_documents((REAL / name).read_text())
    doc["metadata"]["namespace"] = "default"
    return doc


def test_discovery_prefers_v1beta1_and_every_object_is_served_in_it(api, kube):
    assert kube.served_dgd_versions() == ["v1beta1", "v1alpha1"] and kube.dgd_version() == "v1beta1"
    api.apply(real("v1beta1_vllm_disagg.yaml"))
    api.apply(real("v1alpha1_vllm_agg.yaml"))
    # Stored in v1alpha1, converted for each reader: a v1beta1 client sees components lists only.
    got = {d.name: (d.form, d.api_version) for d in kube.list_dgds("default")}
    assert got == {"vllm-disagg": ("components", "nvidia.com/v1beta1"), "vllm-agg": ("components", "nvidia.com/v1beta1")}
    alpha = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "vllm-disagg")
    assert sorted(alpha["spec"]["services"]) == ["Frontend", "VllmDecodeWorker", "VllmPrefillWorker"]


def test_a_cluster_serving_only_v1alpha1_is_read_through_it(tmp_path):
    with ApiServer(resources=[rt for rt in DEFAULT_RESOURCES if rt.version != "v1beta1"]) as only_alpha:
        only_alpha.apply(real("v1alpha1_vllm_disagg.yaml"))
        kube = KubeCluster.from_kubeconfig(str(only_alpha.write_kubeconfig(tmp_path / "kc")))
        assert kube.served_dgd_versions() == ["v1alpha1"]
        assert kube.get_dgd("default", "vllm-disagg").form == "services"
        kube.close()


def test_no_dgd_version_served_is_a_clear_not_found(tmp_path):
    with ApiServer(resources=[rt for rt in DEFAULT_RESOURCES if rt.group != "nvidia.com"]) as bare:
        kube = KubeCluster.from_kubeconfig(str(bare.write_kubeconfig(tmp_path / "kc")))
        with pytest.raises(NotFound, match="serves no nvidia.com DynamoGraphDeployment version"):
            kube.list_dgds()
        kube.close()


def test_services_replicas_are_a_merge_patch_that_leaves_everything_else(api, kube):
    api.apply(real("v1alpha1_vllm_disagg.yaml"))
    stale = kube.get_dgd("default", "vllm-disagg")
    obj = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "vllm-disagg")
    obj["spec"]["services"]["Frontend"]["replicas"] = 2  # someone else's concurrent change
    api.apply(obj)
    after = kube.patch_dgd_replicas("default", "vllm-disagg", {"VllmDecodeWorker": 3}, current=stale)
    assert after.component("VllmDecodeWorker").replicas == 3
    assert after.component("Frontend").replicas == 2  # not reverted: no full-object update


def test_components_replicas_are_a_json_patch_fenced_by_name_and_version(api, kube):
    api.apply(real("v1beta1_vllm_disagg.yaml"))
    read = kube.get_dgd("default", "vllm-disagg")
    after = kube.patch_dgd_replicas("default", "vllm-disagg", {"VllmPrefillWorker": 4}, current=read)
    assert after.component("VllmPrefillWorker").replicas == 4 and after.component("VllmDecodeWorker").replicas == 1
    with pytest.raises(Conflict):  # fenced on the version read before the last write
        kube.patch_dgd_replicas("default", "vllm-disagg", {"VllmPrefillWorker": 2}, current=read,
                                resource_version=read.resource_version)
    moved = api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "vllm-disagg")
    moved["spec"]["components"] = [c for c in moved["spec"]["components"] if c["name"] != "Frontend"]
    api.apply(moved)
    with pytest.raises(Conflict, match="changed since it was read"):  # the index now holds another component
        kube.patch_dgd_replicas("default", "vllm-disagg", {"VllmPrefillWorker": 2}, current=read)
    assert kube.get_dgd("default", "vllm-disagg").component("VllmPrefillWorker").replicas == 4


def test_list_nodes_with_labels(api, kube):
    for name, rack in (("gpu-a", "r1"), ("gpu-b", "r2")):
        api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"rack": rack}}})
    assert {(n.name, n.labels["rack"]) for n in kube.list_nodes()} == {("gpu-a", "r1"), ("gpu-b", "r2")}
    assert [n.name for n in kube.list_nodes(label_selector="rack=r2")] == ["gpu-b"]


def test_registered_resource_appears_in_discovery(api, kube):
    api.register(ResourceType("example.com", "v1", "widgets", "Widget"))
    from kubernetes import client
    groups = client.ApisApi(kube.api_client).get_api_versions()
    nvidia = next(g for g in groups.groups if g.name == "nvidia.com")
    assert [v.version for v in nvidia.versions] == ["v1beta1", "v1alpha1"]
    assert nvidia.preferred_version.version == "v1beta1"
    assert any(g.name == "example.com" for g in groups.groups)
