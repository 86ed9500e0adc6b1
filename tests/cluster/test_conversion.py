"""Stored in one version, served in both: DGD conversion through the official client."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from kubernetes.client.exceptions import ApiException
from hypothesis import strategies as st

from powerfleet.cluster.dgd import parse_dgd
from powerfleet.twin.apiserver.conversion import DGD_KEY, convert
from powerfleet.twin.cluster.manifests import DISAGG, dgd_manifests
from powerfleet.twin.cluster.topology import TwinSpec

ALPHA, BETA = "nvidia.com/v1alpha1", "nvidia.com/v1beta1"
KIND = "DynamoGraphDeployment"


def test_a_v1alpha1_object_is_served_as_v1beta1_with_the_same_power_inputs(api, kube) -> None:
    api.apply(dgd_manifests(TwinSpec(nodes=2))[0])
    beta = api.get(BETA, KIND, DISAGG)
    assert beta["apiVersion"] == BETA and [c["name"] for c in beta["spec"]["components"]] == [
        "decode", "frontend", "planner", "prefill"]
    decode = next(c for c in beta["spec"]["components"] if c["name"] == "decode")
    main = decode["podTemplate"]["spec"]["containers"][0]
    assert main["name"] == "main" and main["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert decode["type"] == "worker" and decode["subComponentType"] == "decode"
    a, b = parse_dgd(api.get(ALPHA, KIND, DISAGG)), kube.get_dgd("default", DISAGG)
    assert {c.name: (c.gpus_per_pod, c.power_annotation, c.replicas) for c in a.components} == {
        c.name: (c.gpus_per_pod, c.power_annotation, c.replicas) for c in b.components}


def test_a_replica_write_through_v1beta1_keeps_the_stored_component_verbatim(api, kube) -> None:
    api.apply(dgd_manifests(TwinSpec(nodes=2))[0])
    stored = api.get(ALPHA, KIND, DISAGG)
    kube.patch_dgd_replicas("default", DISAGG, {"decode": 3})
    after = api.get(ALPHA, KIND, DISAGG)
    want = stored["spec"]["services"]
    want["decode"]["replicas"] = 3
    assert after["spec"]["services"] == want  # Dynamo's resources.gpu and the args survive
    assert after["metadata"]["generation"] == stored["metadata"]["generation"] + 1


def test_status_is_converted_and_what_a_version_lacks_is_dropped(api, kube) -> None:
    obj = dgd_manifests(TwinSpec(nodes=2))[0]
    obj["spec"]["services"]["decode"]["dynamoNamespace"] = "ns-only-in-v1alpha1"
    api.apply(obj)
    kube.custom.patch_namespaced_custom_object_status(
        "nvidia.com", "v1alpha1", "default", "dynamographdeployments", DISAGG,
        {"status": {"state": "pending", "rollingUpdate": {"phase": "InProgress", "updatedServices": ["prefill"]},
                    "services": {"decode": {"componentKind": "Deployment", "componentName": "llm-disagg-decode",
                                            "replicas": 1, "updatedReplicas": 1, "readyReplicas": 0}}}})
    status = api.get(BETA, KIND, DISAGG)["status"]
    assert status["rollingUpdate"]["updatedComponents"] == ["prefill"] and "services" not in status
    assert status["components"]["decode"]["componentNames"] == ["llm-disagg-decode"]
    assert kube.get_dgd("default", DISAGG).status.components["decode"].ready_replicas == 0
    # A template change written through v1beta1 cannot carry v1alpha1's dynamoNamespace.
    beta = api.get(BETA, KIND, DISAGG)
    decode = next(c for c in beta["spec"]["components"] if c["name"] == "decode")
    decode["podTemplate"]["metadata"]["annotations"]["dynamo.nvidia.com/gpu-power-limit"] = "400"
    beta["spec"]["annotations"] = {"only": "v1beta1"}
    kube.custom.replace_namespaced_custom_object("nvidia.com", "v1beta1", "default", "dynamographdeployments",
                                                 DISAGG, beta)
    alpha = api.get(ALPHA, KIND, DISAGG)["spec"]
    assert "dynamoNamespace" not in alpha["services"]["decode"] and "annotations" not in alpha
    assert alpha["services"]["decode"]["extraPodMetadata"]["annotations"]["dynamo.nvidia.com/gpu-power-limit"] == "400"


_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 9) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=25)


@settings(max_examples=150, deadline=None)
@given(spec=st.one_of(_json, st.fixed_dictionaries({"services": _json}),
                      st.fixed_dictionaries({"components": st.lists(_json, max_size=3)})),
       status=_json)
def test_conversion_never_raises_on_any_shape(spec, status) -> None:
    # Conversion runs on stored objects the schema already accepted, and on seeding; it must
    # never crash a request whatever it is given.
    for version, other in (("v1alpha1", "v1beta1"), ("v1beta1", "v1alpha1")):
        obj = {"apiVersion": f"nvidia.com/{version}", "kind": KIND, "metadata": {"name": "x"},
               "spec": spec, "status": status}
        out = convert(DGD_KEY, obj, other, previous=obj)
        assert out["apiVersion"] == f"nvidia.com/{other}"


def test_a_body_in_another_version_than_the_endpoint_is_refused(api, kube) -> None:
    api.apply(dgd_manifests(TwinSpec(nodes=2))[0])
    beta = api.get(BETA, KIND, DISAGG)
    with pytest.raises(ApiException) as info:  # a v1beta1 body PUT to the v1alpha1 endpoint
        kube.custom.replace_namespaced_custom_object("nvidia.com", "v1alpha1", "default", "dynamographdeployments",
                                                     DISAGG, beta)
    assert info.value.status == 400 and "does not match the expected API version" in info.value.body
    assert "services" in api.get(ALPHA, KIND, DISAGG)["spec"]
