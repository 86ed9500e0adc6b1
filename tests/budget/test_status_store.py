"""The budget's status in a ConfigMap powerfleet owns, one condition on the DGD (issue 18 item 5):
readable, written once per change, transition events once per transition, the operator's
conditions untouched."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.persist import ConfigMapStatus
from powerfleet.budget.program import DeploymentBudget
from powerfleet.budget.runner import evaluate_deployment
from powerfleet.clock import FakeClock
from powerfleet.cluster.budget_store import (
    CONDITION_TYPE,
    STATUS_KEY,
    KubeBudgetStore,
    condition_patch,
    status_object_name,
    stored_status,
)
from powerfleet.testing.budget.stand_in_operator import budget_status

DGD_V = "nvidia.com/v1beta1"
KIND = "DynamoGraphDeployment"
OPERATOR_CONDITION = {"type": "Ready", "status": "True", "reason": "AllReady", "message": "all components ready",
                      "lastTransitionTime": "2027-01-01T00:00:00Z"}


@pytest.fixture
def world(world):
    api, kube, state = world
    kube.patch_dgd_status("default", "llama", {"conditions": [OPERATOR_CONDITION]})
    return world


def run(kube, state, clock):
    return evaluate_deployment(kube, state, "default/llama", DeploymentBudget(power_limit_w=5000), None, clock,
                               ConfigMapStatus(KubeBudgetStore(kube)))


def test_status_lives_in_a_configmap_and_the_dgd_gets_one_condition(world):
    api, kube, state = world
    clock = FakeClock(t=1_800_000_000.0)
    first = run(kube, state, clock)
    assert first.status_written and first.events == ["Planned", "PowerInputsAdmitted"]
    cm = api.get("v1", "ConfigMap", status_object_name("llama"))
    status = json.loads(cm["data"][STATUS_KEY])
    assert status["reason"] == "Planned" and status["settledWatts"] == 1000
    assert (cm["data"]["ready"], cm["data"]["reason"]) == ("True", "Planned")  # kubectl's columns
    obj = api.get(DGD_V, KIND, "llama")
    assert cm["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert "budget" not in obj["status"]
    operator, ours = obj["status"]["conditions"]
    assert operator == OPERATOR_CONDITION
    assert ours["type"] == CONDITION_TYPE and (ours["status"], ours["reason"]) == ("True", "Planned")


def test_unchanged_evaluations_write_nothing_and_a_transition_fires_once(world):
    api, kube, state = world
    clock = FakeClock(t=1_800_000_000.0)
    run(kube, state, clock)
    dgd_rv = api.get(DGD_V, KIND, "llama")["metadata"]["resourceVersion"]
    cm_rv = api.get("v1", "ConfigMap", status_object_name("llama"))["metadata"]["resourceVersion"]
    for _ in range(3):
        clock.advance(30)
        again = run(kube, state, clock)
        assert not again.status_written and again.events == []
    assert api.get(DGD_V, KIND, "llama")["metadata"]["resourceVersion"] == dgd_rv
    assert api.get("v1", "ConfigMap", status_object_name("llama"))["metadata"]["resourceVersion"] == cm_rv
    assert [e.reason for e in kube.list_events("default", involved_name="llama")].count("Planned") == 1
    # the operator rewrites its conditions without ours: the next evaluation puts ours back, alone
    kube.patch_dgd_status("default", "llama", {"conditions": [OPERATOR_CONDITION]})
    run(kube, state, clock)
    assert [c["type"] for c in api.get(DGD_V, KIND, "llama")["status"]["conditions"]] == ["Ready", CONDITION_TYPE]


def test_a_status_left_by_an_earlier_dgd_of_the_same_name_is_not_this_ones(world):
    api, kube, state = world
    clock = FakeClock(t=1_800_000_000.0)
    run(kube, state, clock)
    cm = api.get("v1", "ConfigMap", status_object_name("llama"))
    cm["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-uid"
    api.apply(cm)
    again = run(kube, state, clock)
    assert again.status_written and again.events[0] == "Planned"
    assert budget_status(api, "llama")["reason"] == "Planned"


def test_condition_patch_touches_only_its_own_entry():
    ours = {"type": CONDITION_TYPE, "status": "True", "reason": "Planned", "message": "within budget"}
    meta = {"name": "d", "namespace": "n", "resourceVersion": "7"}
    fence = {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert condition_patch({"metadata": meta}, ours) == [fence, {"op": "add", "path": "/status",
                                                                 "value": {"conditions": [ours]}}]
    assert condition_patch({"metadata": meta, "status": {"state": "x"}}, ours) == [
        fence, {"op": "add", "path": "/status/conditions", "value": [ours]}]
    others = {"metadata": meta, "status": {"conditions": [OPERATOR_CONDITION]}}
    assert condition_patch(others, ours) == [{"op": "add", "path": "/status/conditions/-", "value": ours}]
    stale = {"metadata": meta, "status": {"conditions": [OPERATOR_CONDITION, {**ours, "reason": "Refused"}]}}
    assert condition_patch(stale, ours) == [
        {"op": "test", "path": "/status/conditions/1/type", "value": CONDITION_TYPE},
        {"op": "replace", "path": "/status/conditions/1", "value": ours}]
    assert condition_patch({"metadata": meta, "status": {"conditions": [OPERATOR_CONDITION, ours]}}, ours) is None
    # a generation moved on by powerfleet's own replica write alone rewrites nothing
    moved = {**ours, "observedGeneration": 8}
    assert condition_patch({"metadata": meta, "status": {"conditions": [OPERATOR_CONDITION, ours]}}, moved) is None


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                    max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=60), json_values.map(json.dumps)), st.lists(json_values, max_size=2))
def test_a_stored_status_of_any_shape_reads_as_a_mapping(raw, owners):
    out = stored_status({"metadata": {"ownerReferences": owners}, "data": {STATUS_KEY: raw}})
    assert isinstance(out.status, dict) and isinstance(out.owner_uid, str)
