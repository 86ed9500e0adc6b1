"""DRA claims that are not GPUs (issue 18 item 7): the device classes are read from the
ResourceClaimTemplates, through the runner, against the loopback API server."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.persist import ConfigMapStatus
from powerfleet.budget.program import DeploymentBudget
from powerfleet.budget.runner import evaluate_deployment
from powerfleet.clock import FakeClock
from powerfleet.cluster.budget_store import KubeBudgetStore
from powerfleet.cluster.dra import KubeDra, device_classes
from powerfleet.twin.apiserver.resources import ResourceType
from powerfleet.testing.budget.stand_in_operator import budget_status, settle

TEMPLATES = ResourceType("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate")


def template(name: str, device_class: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "ch", "exactly": {"deviceClassName": device_class}}]}}}}


def test_device_classes_of_every_request_shape():
    assert device_classes(template("t", "gpu.nvidia.com")) == ("gpu.nvidia.com",)
    v1beta1 = {"spec": {"spec": {"devices": {"requests": [{"name": "a", "deviceClassName": "mig.nvidia.com"}]}}}}
    assert device_classes(v1beta1) == ("mig.nvidia.com",)
    first = {"spec": {"spec": {"devices": {"requests": [{"name": "a", "firstAvailable": [
        {"name": "x", "deviceClassName": "gpu.nvidia.com"}, {"name": "y", "deviceClassName": "other.example.com"}]}]}}}}
    assert device_classes(first) == ("gpu.nvidia.com", "other.example.com")


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["spec", "devices", "requests", "exactly", "firstAvailable", "deviceClassName"]),
                        inner, max_size=4), max_leaves=12))
def test_a_template_of_any_shape_reads_as_a_tuple_of_names(raw):
    got = device_classes({"spec": raw} if not isinstance(raw, dict) else raw)
    assert isinstance(got, tuple) and all(isinstance(c, str) for c in got)


def test_a_deployment_with_a_compute_domain_claim_is_admitted_and_planned(world):
    api, kube, state = world
    api.register(TEMPLATES)
    api.apply(template("llama-channel", "compute-domain-default-channel.nvidia.com"))
    obj = api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "llama")
    for item in obj["spec"]["components"][1:]:
        spec = item["podTemplate"]["spec"]
        spec["resourceClaims"] = [{"name": "channel", "resourceClaimTemplateName": "llama-channel"}]
        spec["containers"][0]["resources"]["claims"] = [{"name": "channel"}]
    api.apply(obj)
    settle(api, kube, "llama", ["gpu-0"])

    def run(dra):
        return evaluate_deployment(kube, state, "default/llama", DeploymentBudget(power_limit_w=5000), None,
                                   FakeClock(t=1_800_000_000.0), ConfigMapStatus(KubeBudgetStore(kube)), dra=dra)

    blind = run(None)  # the templates not looked up: the claim may allocate GPUs
    assert blind.reason == "InvalidPowerInputs" and "could not be looked up" in budget_status(api, "llama")["message"]
    seen = run(KubeDra(kube))
    assert seen.reason == "Planned" and seen.settled_w == 1000, json.dumps(budget_status(api, "llama"))
