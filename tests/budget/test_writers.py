"""Other owners of the replicas (issue 18 item 6): a scaling adapter is written instead of the DGD,
a Planner component or another writer stops powerfleet scaling unless it is the sole writer, and a
422 from the server is an error with its message, a failed JSON patch test a conflict."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from powerfleet.budget.persist import ConfigMapStatus
from powerfleet.budget.program import DeploymentBudget
from powerfleet.budget.runner import evaluate_deployment
from powerfleet.clock import FakeClock
from powerfleet.cluster.budget_store import KubeBudgetStore
from powerfleet.cluster.patch_errors import Rejected, raise_for_patch
from powerfleet.cluster.ports import Conflict
from powerfleet.cluster.scaling import KubeScaling
from powerfleet.testing.budget.stand_in_operator import budget_status, replicas, settle

DGD_V, KIND = "nvidia.com/v1beta1", "DynamoGraphDeployment"


def run(kube, state, clock, **budget):
    return evaluate_deployment(kube, state, "default/llama", DeploymentBudget(power_limit_w=5000, **budget), None,
                               clock, ConfigMapStatus(KubeBudgetStore(kube)), KubeScaling(kube))


def adapter(api, component: str, n: int) -> None:
    api.apply({"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeploymentScalingAdapter",
               "metadata": {"name": f"llama-{component}", "namespace": "default"},
               "spec": {"replicas": n, "dgdRef": {"name": "llama", "serviceName": component}}})


def test_a_component_with_a_scaling_adapter_is_scaled_through_it(world):
    api, kube, state = world
    adapter(api, "decode", 1)
    clock = FakeClock(t=1_800_000_000.0)
    run(kube, state, clock)
    state.propose("default/llama", {"decode": 3}, at=0, source="test")
    out = run(kube, state, clock)
    assert out.replicas_written == {"decode": 3} and budget_status(api, "llama")["lastScale"]["changes"] == [
        "decode replicas 1 -> 3 (decode)"]
    assert api.get("nvidia.com/v1alpha1", "DynamoGraphDeploymentScalingAdapter", "llama-decode")["spec"]["replicas"] == 3
    assert replicas(api, "llama") == {"prefill": 1, "decode": 1}  # the DGD is never patched for it
    # before the adapter controller copies 3 onto the DGD, decode is charged at 3 and nothing else moves
    state.propose("default/llama", {"decode": 3, "prefill": 3}, at=0, source="test")
    again = run(kube, state, clock)
    assert again.reason == "Planned" and again.replicas_written == {} and again.settled_w == 3 * 500 + 1 * 500


def test_a_planner_component_is_a_second_writer_unless_powerfleet_is_the_sole_writer(world):
    api, kube, state = world
    obj = api.get(DGD_V, KIND, "llama")
    obj["spec"]["components"].append({"name": "Planner", "type": "planner", "replicas": 1})
    api.apply(obj)
    settle(api, kube, "llama", ["gpu-0"])
    clock = FakeClock(t=1_800_000_000.0)
    state.propose("default/llama", {"decode": 2}, at=0, source="test")
    out = run(kube, state, clock)
    assert out.reason == "OtherWriter" and out.replicas_written == {} and not out.ready
    st = budget_status(api, "llama")
    assert "'Planner' is a Dynamo Planner" in st["message"] and st["targets"] == {"decode": 2}
    assert replicas(api, "llama")["decode"] == 1
    sole = run(kube, state, clock, sole_writer=True)
    assert sole.reason == "Planned" and sole.replicas_written == {"decode": 2}


def test_replicas_changed_by_someone_else_stop_powerfleet_until_readmitted(world):
    api, kube, state = world
    clock = FakeClock(t=1_800_000_000.0)
    run(kube, state, clock)
    kube.patch_dgd_replicas("default", "llama", {"decode": 2})  # an HPA, a person, another controller
    state.propose("default/llama", {"decode": 4}, at=0, source="test")
    out = run(kube, state, clock)
    assert out.reason == "OtherWriter" and out.replicas_written == {}
    assert "decode 1 -> 2" in budget_status(api, "llama")["message"]
    assert run(kube, state, clock).reason == "OtherWriter"  # sticky: not forgotten at the next evaluation
    state.forget_admission("default/llama")  # budget.readmit
    assert run(kube, state, clock).reason in ("Planned", "AwaitingSettlement")


def test_a_rejected_replica_write_is_an_error_with_the_servers_message(world, monkeypatch):
    api, kube, state = world
    clock = FakeClock(t=1_800_000_000.0)
    run(kube, state, clock)
    state.propose("default/llama", {"decode": 3}, at=0, source="test")

    def refuse(*a, **kw):
        raise Rejected("patch DGD replicas default/llama: HTTP 422 rejected by the server: "
                       "admission webhook \"dgd.nvidia.com\" denied the request: replicas above quota", status=422)

    monkeypatch.setattr(kube, "patch_dgd_replicas", refuse)
    out = run(kube, state, clock)
    assert out.reason == "ReplicaWriteRejected" and out.replicas_written == {}
    st = budget_status(api, "llama")
    assert st["ready"] == "False" and "denied the request: replicas above quota" in st["message"]
    assert ("ReplicaWriteRejected", "Warning") in [(e.reason, e.type) for e in kube.list_events(
        "default", involved_name="llama")]
    assert "conflicted" not in st["message"]


def api_exception(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="Unprocessable Entity" if status == 422 else "Error")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return exc


@pytest.mark.parametrize(("message", "kind"), [
    ("testing value /metadata/resourceVersion failed", Conflict),  # kube-apiserver's failed test
    ("test failed at '/spec/components/1/name'", Conflict),  # the loopback server's
    ("DynamoGraphDeployment.nvidia.com \"llama\" is invalid: spec.components[1].replicas: Invalid value: -1", Rejected),
    ("admission webhook \"v.dynamo\" denied the request: nope", Rejected),
])
def test_only_a_failed_json_patch_test_is_a_conflict(message, kind):
    with pytest.raises(kind) as info:
        raise_for_patch("patch DGD replicas default/llama", api_exception(422, message))
    assert type(info.value) is kind
    if kind is Rejected:
        assert message in str(info.value) and info.value.status == 422
    with pytest.raises(ApiException):
        raise_for_patch("x", api_exception(500, "boom"))
