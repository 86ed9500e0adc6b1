"""The loopback API server's own contract, mostly through the official client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.twin.apiserver import ApiError, ApiServer, json_patch, merge_patch, parse_field_selector, parse_label_selector
from tests.cluster.builders import disagg, pod_obj


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": ""}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("a notin (1,2)", {}, True),
        ("!a", {"a": "x"}, False),
        ("example.com/x-y", {"example.com/x-y": "v"}, True),
    ],
)
def test_label_selectors(selector, labels, expected):
    assert parse_label_selector(selector)(labels) is expected


@pytest.mark.parametrize("bad", ["a in 1", "=x", "a in (1", "!a in (1)"])
def test_bad_label_selector(bad):
    with pytest.raises(ApiError) as info:
        parse_label_selector(bad)
    assert info.value.code == 400


def test_field_selectors_on_dotted_paths():
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert parse_field_selector("spec.nodeName=n1,status.phase!=Failed,metadata.name==p")(pod)
    assert parse_field_selector("spec.nodeName=")({"spec": {}})  # unscheduled pods
    assert not parse_field_selector("metadata.namespace=x")(pod)


def test_merge_and_json_patch():
    doc = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge_patch(doc, {"a": {"b": None, "c": [3]}, "e": 2}) == {"a": {"c": [3]}, "d": 1, "e": 2}
    assert json_patch(doc, [{"op": "replace", "path": "/a/c/0", "value": 9}, {"op": "add", "path": "/a/c/-", "value": 3},
                            {"op": "remove", "path": "/d"}]) == {"a": {"b": 1, "c": [9, 2, 3]}}
    with pytest.raises(ApiError):
        json_patch(doc, [{"op": "test", "path": "/d", "value": 2}])


def test_error_statuses_are_kubernetes_shaped(api, kube):
    with pytest.raises(ApiException) as info:
        kube.core.read_namespaced_pod("missing", "default")
    body = json.loads(info.value.body)
    assert info.value.status == 404
    assert {k: body[k] for k in ("kind", "status", "reason", "code")} == {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="p"), spec=client.V1PodSpec(containers=[client.V1Container(name="c")]))
    kube.core.create_namespaced_pod("default", pod)
    with pytest.raises(ApiException) as info:
        kube.core.create_namespaced_pod("default", pod)
    assert (info.value.status, json.loads(info.value.body)["reason"]) == (409, "AlreadyExists")
    req = urllib.request.Request(f"{api.url}/apis/nvidia.com/v1alpha1/namespaces/default/dynamographdeployments/x",
                                 method="PUT", data=b'{"metadata": {"name": "x"}}', headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req)
    assert http.value.code == 404
    api.apply(disagg())
    obj = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "llama")
    obj["metadata"].pop("resourceVersion")
    req = urllib.request.Request(f"{api.url}/apis/nvidia.com/v1alpha1/namespaces/default/dynamographdeployments/llama",
                                 method="PUT", data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req)
    assert http.value.code == 422  # custom resources need a resourceVersion on update


def test_create_resets_status_and_sets_metadata(api, kube):
    body = pod_obj("p", node="gpu-0")
    body["metadata"]["generateName"] = "decode-"
    del body["metadata"]["name"]
    created = kube.core.create_namespaced_pod("default", body)
    assert created.metadata.name.startswith("decode-") and created.metadata.uid and created.metadata.creation_timestamp
    assert created.status.phase == "Pending"  # status comes from the status subresource, not from create
    status = kube.core.patch_namespaced_pod_status(created.metadata.name, "default", {"status": {"phase": "Running"}})
    assert status.status.phase == "Running"
    # the client's default content type for core patches is JSON patch; a list body is applied as one
    patched = kube.core.patch_namespaced_pod(created.metadata.name, "default",
                                             [{"op": "add", "path": "/metadata/labels/x", "value": "y"}])
    assert patched.metadata.labels["x"] == "y" and patched.status.phase == "Running"
    # a strategic-merge patch is treated as a merge patch
    patched = kube.core.patch_namespaced_pod(created.metadata.name, "default", {"metadata": {"labels": {"x": None}}},
                                             _content_type="application/strategic-merge-patch+json")
    assert "x" not in (patched.metadata.labels or {})


def test_nodes_are_cluster_scoped(api, kube):
    api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0", "labels": {"nvidia.com/gpu.present": "true"}}})
    api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-0"}})
    nodes = kube.core.list_node(label_selector="nvidia.com/gpu.present=true").items
    assert [n.metadata.name for n in nodes] == ["gpu-0"] and nodes[0].metadata.namespace is None
    assert kube.core.read_node("cpu-0").metadata.name == "cpu-0"


def test_noop_update_keeps_resource_version(api, kube):
    api.apply(pod_obj("p"))
    pod = kube.core.read_namespaced_pod("p", "default")
    again = kube.core.replace_namespaced_pod("p", "default", pod)
    assert again.metadata.resource_version == pod.metadata.resource_version


def test_watch_from_expired_resource_version_gets_410():
    with ApiServer() as api:
        for i in range(3):
            api.apply(pod_obj(f"p{i}"))
        api.store.log.clear()
        api.apply(pod_obj("late"))
        with urllib.request.urlopen(f"{api.url}/api/v1/namespaces/default/pods?watch=true&resourceVersion=1&timeoutSeconds=5") as resp:
            first = json.loads(resp.readline())
    assert first["type"] == "ERROR" and first["object"]["code"] == 410


def test_apply_and_python_accessors(api):
    api.apply(pod_obj("p", cap="300"))
    api.apply(pod_obj("p", cap="250"))
    [pod] = api.list("v1", "Pod", "default")
    assert pod["metadata"]["annotations"]["dynamo.nvidia.com/gpu-power-limit"] == "250" and pod["status"]["phase"] == "Running"
    api.delete("v1", "Pod", "p")
    assert api.list("v1", "Pod") == []
    with pytest.raises(ValueError):
        api.apply({"apiVersion": "v9", "kind": "Nope", "metadata": {"name": "x"}})
