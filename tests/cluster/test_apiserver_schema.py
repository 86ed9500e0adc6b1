"""The loopback server refuses and rewrites what a real kube-apiserver does, through the official
client: structural schemas (pruning, defaults, validation, fieldValidation), metadata limits,
patch content types and body size."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.dgd import parse_dgd
from powerfleet.cluster.manifests import dgd_documents
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.apiserver.options import ServerOptions
from powerfleet.twin.fidelity import KEEP_FOREIGN_DGD_STATUS

REAL = Path(__file__).parent / "fixtures" / "real"
GROUP, PLURAL = "nvidia.com", "dynamographdeployments"


def _dgd(name: str = "llm", **spec_extra) -> dict:
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": name},
            "spec": {"services": {"decode": {"componentType": "worker", "replicas": 1}}, **spec_extra}}


@pytest.fixture
def custom(kube) -> client.CustomObjectsApi:
    return kube.custom


def _raw(api: ApiServer, method: str, path: str, body: bytes, ctype: str = "application/json") -> tuple[int, dict, dict]:
    req = urllib.request.Request(f"{api.url}{path}", method=method, data=body, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


def _fails(call, code: int) -> dict:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == code, info.value.body
    return json.loads(info.value.body)


def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(api, custom) -> None:
    path = "/apis/nvidia.com/v1alpha1/namespaces/default/dynamographdeployments"
    code, headers, body = _raw(api, "POST", path, json.dumps(_dgd(bogus={"x": 1})).encode())
    assert code == 201 and "bogus" not in body["spec"] and headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    assert "bogus" not in api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "llm")["spec"]
    strict = _fails(lambda: custom.create_namespaced_custom_object(GROUP, "v1alpha1", "default", PLURAL,
                                                                   _dgd("other", bogus=1), field_validation="Strict"), 400)
    assert strict["message"] == ('DynamoGraphDeployment in version "v1alpha1" cannot be handled as a '
                                 'DynamoGraphDeployment: strict decoding error: unknown field "spec.bogus"')
    quiet = custom.create_namespaced_custom_object(GROUP, "v1alpha1", "default", PLURAL, _dgd("third", bogus=1),
                                                   field_validation="Ignore")
    assert "bogus" not in quiet["spec"]


def test_types_enums_bounds_and_required_fields_are_422_naming_the_path(custom) -> None:
    bad = _dgd()
    bad["spec"]["services"]["decode"]["replicas"] = -1
    bad["spec"]["backendFramework"] = "onnx"
    body = _fails(lambda: custom.create_namespaced_custom_object(GROUP, "v1alpha1", "default", PLURAL, bad), 422)
    fields = {c["field"] for c in body["details"]["causes"]}
    assert fields == {"spec.services.decode.replicas", "spec.backendFramework"} and body["reason"] == "Invalid"
    assert "spec.services.decode.replicas: Invalid value: -1" in body["message"]
    adapter = {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeploymentScalingAdapter",
               "metadata": {"name": "a"}, "spec": {"replicas": "2"}}
    body = _fails(lambda: custom.create_namespaced_custom_object(
        GROUP, "v1beta1", "default", "dynamographdeploymentscalingadapters", adapter), 422)
    assert {c["field"] for c in body["details"]["causes"]} == {"spec.replicas", "spec.dgdRef"}


def test_dgd_status_is_pruned_defaulted_and_validated_when_the_switch_is_on(tmp_path) -> None:
    with ApiServer(options=ServerOptions(prune_dgd_status=True)) as api:
        api.apply(_dgd())
        from powerfleet.cluster.kube import KubeCluster
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        try:
            written = kube.patch_dgd_status("default", "llm", {"budget": {"ready": "True"}, "observedGeneration": 1})
            assert "budget" not in written["status"] and written["status"]["state"] == "initializing"
            with pytest.raises(Exception, match="422"):
                kube.patch_dgd_status("default", "llm", {"state": "done"})
        finally:
            kube.close()


def test_by_default_foreign_dgd_status_is_pruned(api, kube) -> None:
    # The faithful default (twin/fidelity.py KEEP_FOREIGN_DGD_STATUS is False): as a real server,
    # an undeclared status field is dropped on write (the lenient twin, prune_dgd_status=False, kept it).
    assert KEEP_FOREIGN_DGD_STATUS is False
    api.apply(_dgd())
    written = kube.patch_dgd_status("default", "llm", {"budget": {"ready": "True"}})
    assert "budget" not in written["status"] and written["status"]["state"] == "initializing"


def test_real_manifests_survive_a_write(api) -> None:
    # The reduced schema keeps every field Dynamo's own manifests use. A v1alpha1 (storage)
    # manifest comes back verbatim; a v1beta1 one is stored converted and comes back with what
    # the fleet reads unchanged (containers may be reordered: main first).
    for path in sorted(REAL.glob("*.yaml")):
        for doc in dgd_documents(path.read_text()):
            doc["metadata"]["namespace"] = "default"
            stored = api.apply(doc)
            if doc["apiVersion"].endswith("v1alpha1"):
                assert stored["spec"] == doc["spec"], path.name
            else:
                assert parse_dgd(stored).components == parse_dgd(doc).components, path.name


def test_patch_content_types(api, kube, custom) -> None:
    api.apply(_dgd())
    smp = "application/strategic-merge-patch+json"  # kubectl patch's default type
    body = _fails(lambda: custom.patch_namespaced_custom_object(
        GROUP, "v1alpha1", "default", PLURAL, "llm", {"spec": {"services": {"decode": {"replicas": 2}}}},
        _content_type=smp), 415)
    assert body["reason"] == "UnsupportedMediaType"
    # The client sends a dict to a custom object as a merge patch: accepted.
    merged = custom.patch_namespaced_custom_object(GROUP, "v1alpha1", "default", PLURAL, "llm",
                                                   {"spec": {"services": {"decode": {"replicas": 2}}}})
    assert merged["spec"]["services"]["decode"]["replicas"] == 2
    code, _, _ = _raw(api, "PATCH", "/apis/nvidia.com/v1alpha1/namespaces/default/dynamographdeployments/llm",
                      b'{"spec": {}}', "application/json-patch+json")
    assert code == 400  # a JSON patch is a list of operations
    _fails(lambda: custom.patch_namespaced_custom_object(
        GROUP, "v1alpha1", "default", PLURAL, "llm", {"spec": {}}, _content_type="application/apply-patch+yaml"), 415)
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="p"), spec=client.V1PodSpec(containers=[client.V1Container(name="c")]))
    kube.core.create_namespaced_pod("default", pod)
    patched = kube.core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})  # strategic: fine
    assert patched.metadata.labels == {"a": "b"}


def test_metadata_limits_and_body_size(api, kube) -> None:
    def pod(name: str = "p", **meta) -> client.V1Pod:
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name, **meta),
                            spec=client.V1PodSpec(containers=[client.V1Container(name="c")]))

    body = _fails(lambda: kube.core.create_namespaced_pod("default", pod("x" * 254)), 422)
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    _fails(lambda: kube.core.create_namespaced_pod("default", pod("Upper_case")), 422)
    body = _fails(lambda: kube.core.create_namespaced_pod("default", pod(labels={"a": "v" * 64})), 422)
    assert body["details"]["causes"][0]["field"] == "metadata.labels"
    body = _fails(lambda: kube.core.create_namespaced_pod("default", pod(annotations={"a": "v" * (256 * 1024)})), 422)
    assert "metadata.annotations" in body["message"]
    kube.core.create_namespaced_pod("default", pod(annotations={"a": "v" * (200 * 1024)}))  # under the limit
    code, _, body = _raw(api, "POST", "/api/v1/namespaces/default/pods", b" " * (3 * 1024 * 1024 + 1))
    assert code == 413 and body["reason"] == "RequestEntityTooLarge"
