"""A replica that holds no node yet is charged to every group it may be scheduled on (its pods'
nodeSelector and required node affinity, cluster/placement.py), not only to the racks its
deployment is on now: the scheduler may put it on a third rack."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.state import BudgetState
from powerfleet.budget.tick import tick_limits
from powerfleet.cluster.gpu_pods import KubeGpuPods
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.placement import ANYWHERE, Placement, placement_of
from powerfleet.config.fleet import DeploymentBudgetConfig
from powerfleet.twin.apiserver import ApiServer
from powerfleet.testing.budget.stand_in_operator import dgd, settle
from tests.budget.test_state_record import json_values

RACK = "powerfleet.io/rack"


def affinity(*terms: list[dict]) -> dict:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}


def test_node_selector_and_required_affinity_say_which_nodes_admit_a_pod():
    labels = {RACK: "rack-a", "gpu": "h100", "gen": "9"}
    assert placement_of({}) == ANYWHERE and ANYWHERE.admits("n", {})
    assert placement_of({"nodeSelector": {"gpu": "h100"}}).admits("n", labels)
    assert not placement_of({"nodeSelector": {"gpu": "a100"}}).admits("n", labels)
    p = placement_of(affinity([{"key": RACK, "operator": "In", "values": ["rack-b"]}],
                              [{"key": "gen", "operator": "Gt", "values": ["8"]}, {"key": "x", "operator": "DoesNotExist"}]))
    assert p.admits("n", labels) and not p.admits("n", {RACK: "rack-c", "gen": "8"})  # the terms are ORed
    assert not placement_of(affinity([{"key": RACK, "operator": "NotIn", "values": ["rack-a"]}])).admits("n", labels)
    fields = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}
    assert placement_of(fields).admits("n1", {}) and not placement_of(fields).admits("n2", {})
    # not understood: admits (a replica charged to a rack it cannot reach costs only growth elsewhere)
    assert placement_of(affinity([{"key": RACK, "operator": "Near", "values": []}])).admits("n", labels)
    assert placement_of({"nodeSelector": ["gpu"]}) == ANYWHERE


specs = st.dictionaries(st.sampled_from(["nodeSelector", "affinity", "containers"]), json_values, max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.one_of(specs, json_values.map(lambda v: {"affinity": {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": v}}}})),
       st.dictionaries(st.sampled_from([RACK, "gpu", "gen"]), st.text(max_size=3), max_size=3))
def test_any_pod_spec_reads_as_a_placement(spec, labels):
    got = placement_of(spec)
    assert isinstance(got, Placement)
    got.admits("n", labels)  # never raises
    if not isinstance(spec.get("nodeSelector"), dict) and "affinity" not in spec:
        assert got == ANYWHERE


@pytest.fixture
def three_racks(tmp_path: Path, broker_url: str):
    with ApiServer() as api:
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        for rack in ("rack-a", "rack-b", "rack-c"):
            api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{rack}", "labels": {RACK: rack}}})
        yield api, kube, BudgetState(redis.Redis.from_url(broker_url))
        kube.close()


def recreate(api: ApiServer, pod: str, extra_spec: dict | None = None, *, unscheduled: bool = False) -> None:
    """The pod again (a pod's spec is immutable), with ``extra_spec``; unscheduled: Pending on no node."""
    body = api.get("v1", "Pod", pod, "default")
    body["spec"].update(extra_spec or {})
    if unscheduled:
        body["spec"].pop("nodeName", None)
        body["status"] = {"phase": "Pending"}
    api.delete("v1", "Pod", pod, "default")
    body["metadata"] = {k: body["metadata"][k] for k in ("name", "namespace", "labels", "annotations")}
    api.apply(body)


def test_an_unplaced_replica_is_charged_to_every_rack_it_may_be_scheduled_on(three_racks):
    api, kube, state = three_racks
    api.apply(dgd("alpha", 1, 2))  # 1 GPU x 500 W per replica
    settle(api, kube, "alpha", ["gpu-rack-a"], with_gpus=True)
    recreate(api, "alpha-decode-1", unscheduled=True)  # Pending, no node yet, no constraint: any rack
    budgets = {"rack-a": 10_000, "rack-b": 10_000, "rack-c": 10_000}
    cfg = {"default/alpha": DeploymentBudgetConfig(power_limit_w=10_000)}
    plan = tick_limits(kube, state, cfg, budgets, RACK, KubeGpuPods(kube), now=100.0)
    assert plan.limits["default/alpha"].group == "rack-a,rack-b,rack-c"
    assert plan.group_current == {"rack-a": 1500, "rack-b": 500, "rack-c": 500}  # its 2 placed pods, then the 1
    # its pods may land only on rack-a or rack-b: rack-c is not charged
    in_a_or_b = affinity([{"key": RACK, "operator": "In", "values": ["rack-a", "rack-b"]}])
    recreate(api, "alpha-decode-0", in_a_or_b)
    recreate(api, "alpha-decode-1", in_a_or_b, unscheduled=True)
    plan = tick_limits(kube, state, cfg, budgets, RACK, KubeGpuPods(kube), now=100.0)
    assert plan.limits["default/alpha"].group == "rack-a,rack-b"
    assert plan.group_current == {"rack-a": 1500, "rack-b": 500, "rack-c": 0}
