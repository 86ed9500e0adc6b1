"""The runner against the loopback API server and a real redis-server (no worker): the reconcile
contract's writes, conflicts, read failures, and the task argument models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.io import answer
from powerfleet.budget.persist import ConfigMapStatus
from powerfleet.budget.program import DeploymentBudget
from powerfleet.budget.runner import evaluate_deployment as run_evaluation
from powerfleet.budget.runner import is_transient
from powerfleet.budget.state import BudgetState
from powerfleet.clock import FakeClock
from powerfleet.cluster.budget_store import KubeBudgetStore
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.manifests import ManifestError, load_documents
from powerfleet.cluster.ports import ClusterError, Conflict, NotFound
from powerfleet.tasks.base import TaskInputError, decode_args
from powerfleet.tasks.budget import ProposeArgs
from powerfleet.twin.apiserver import ApiServer
from powerfleet.testing.budget.stand_in_operator import budget_status, component_status, dgd, replicas, settle

BUDGET = DeploymentBudget(power_limit_w=5000)


def evaluate_deployment(kube, state, key, budget, group, clock, sink=None):
    """The runner with the default store (a ConfigMap per deployment), as the task configures it."""
    return run_evaluation(kube, state, key, budget, group, clock, sink or ConfigMapStatus(KubeBudgetStore(kube)))


def test_unchanged_status_is_not_rewritten_and_emits_nothing(world):
    api, kube, state = world
    clock = FakeClock(t=1_800_000_000.0)
    first = evaluate_deployment(kube, state, "default/llama", BUDGET, None, clock)
    assert first.status_written and first.events == ["Planned", "PowerInputsAdmitted"]
    rv = api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "llama")["metadata"]["resourceVersion"]
    cm_rv = api.get("v1", "ConfigMap", "llama-powerfleet-budget")["metadata"]["resourceVersion"]
    clock.advance(30)
    again = evaluate_deployment(kube, state, "default/llama", BUDGET, None, clock)
    assert not again.status_written and again.events == [] and again.replicas_written == {}
    assert api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "llama")["metadata"]["resourceVersion"] == rv
    assert api.get("v1", "ConfigMap", "llama-powerfleet-budget")["metadata"]["resourceVersion"] == cm_rv
    state.propose("default/llama", {"decode": 3}, at=clock.now(), source="test")
    scaled = evaluate_deployment(kube, state, "default/llama", BUDGET, None, clock)
    assert scaled.replicas_written == {"decode": 3} and scaled.events == []  # the status records a scale
    assert replicas(api, "llama") == {"prefill": 1, "decode": 3}
    status = budget_status(api, "llama")
    assert status["targets"] == {"decode": 3}
    assert status["lastTransitionTime"] == "2027-01-15T08:00:00Z"  # unchanged reason
    assert status["lastScale"] == {"at": "2027-01-15T08:00:30Z", "changes": ["decode replicas 1 -> 3 (decode)"]}
    clock.advance(30)
    rolling = evaluate_deployment(kube, state, "default/llama", BUDGET, None, clock)  # its new pods not up yet
    assert rolling.status_written and budget_status(api, "llama")["lastScale"] == status["lastScale"]
    cm_rv = api.get("v1", "ConfigMap", "llama-powerfleet-budget")["metadata"]["resourceVersion"]
    clock.advance(30)
    same = evaluate_deployment(kube, state, "default/llama", BUDGET, None, clock)
    assert same.replicas_written == {} and not same.status_written, same  # the last scale is carried, not news
    assert api.get("v1", "ConfigMap", "llama-powerfleet-budget")["metadata"]["resourceVersion"] == cm_rv


def failing_after_admission(world, monkeypatch, method: str, error: ClusterError, decode: int):
    """Admit the deployment, propose ``decode`` replicas, then make ``method`` raise ``error``."""
    api, kube, state = world
    clock = FakeClock(t=1_800_000_000.0)
    evaluate_deployment(kube, state, "default/llama", BUDGET, None, clock)
    state.propose("default/llama", {"decode": decode}, at=0, source="test")

    def fail(*a, **kw):
        raise error

    monkeypatch.setattr(kube, method, fail)
    return evaluate_deployment(kube, state, "default/llama", BUDGET, None, clock)


def test_a_conflicting_replica_write_is_replanned_not_forced(world, monkeypatch):
    api = world[0]
    out = failing_after_admission(world, monkeypatch, "patch_dgd_replicas", Conflict("stale", status=409), 2)
    assert out.replicas_written == {} and "Scaled" not in out.events
    assert "replica write conflicted" in budget_status(api, "llama")["message"]


def test_unreadable_pods_block_scale_ups_and_a_missing_dgd_writes_nothing(world, monkeypatch):
    api, kube, state = world
    out = failing_after_admission(world, monkeypatch, "list_pods", ClusterError("list pods: HTTP 503", status=503), 4)
    assert out.replicas_written == {} and budget_status(api, "llama")["held"] == ["decode"]
    assert evaluate_deployment(kube, state, "default/gone", BUDGET, None, FakeClock()).reason == "NotFound"


def test_invalid_dgd_fails_closed_with_one_status_line(world):
    api, kube, state = world
    obj = api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "llama")
    obj["spec"]["components"][1]["replicas"] = "many"
    api.apply(obj)
    out = evaluate_deployment(kube, state, "default/llama", BUDGET, None, FakeClock())
    assert out.reason == "InvalidDeployment" and out.status_written
    assert "replicas" in budget_status(api, "llama")["message"]


def test_only_transient_errors_are_retried():
    assert is_transient(ClusterError("reset")) and is_transient(ClusterError("x", status=503))
    assert not is_transient(ClusterError("x", status=403)) and not is_transient(Conflict("x", status=409))
    assert not is_transient(NotFound("x", status=404))


def test_propose_arguments_are_validated():
    with pytest.raises(TaskInputError, match="replicas.gpu"):
        decode_args("powerfleet.budget.propose", ProposeArgs, (), {"deployment": "a/b", "replicas": {"gpu": 1}})
    with pytest.raises(TaskInputError, match="deployment"):
        decode_args("powerfleet.budget.propose", ProposeArgs, (), {"deployment": "nameonly", "replicas": {"decode": 1}})


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200))
def test_manifest_reader_fuzz(text):
    try:
        docs = load_documents(text)
    except ManifestError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(docs, list)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers(-5, 20) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["budget", "roles", "power_limit_w", "prefill", "watts_per_replica", "gpus_per_replica",
                         "ready", "proposed"]), inner, max_size=4), max_leaves=12).map(json.dumps)))
def test_plan_input_fuzz(text):
    ans = answer(text)
    assert ("error" in ans) != ("targets" in ans) and ans["schema"] == "powerfleet.budget.plan/v1"


def test_aggregated_v1alpha1_deployment_end_to_end(tmp_path, broker_url):
    """A services-map (v1alpha1) aggregated DGD: admitted, planned, scaled by a merge patch."""
    from powerfleet.budget import metrics
    from prometheus_client import REGISTRY

    obj = {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
           "metadata": {"name": "agg", "namespace": "default"},
           "spec": {"services": {
               "Frontend": {"componentType": "frontend", "replicas": 1},
               "VllmDecodeWorker": {"componentType": "worker", "replicas": 2, "resources": {"limits": {"gpu": "2"}},
                                    "extraPodMetadata": {"annotations": {"dynamo.nvidia.com/gpu-power-limit": "350"}}}}}}
    with ApiServer() as api:
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        api.apply(obj)
        api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "agg-w-0", "namespace": "default", "annotations": {"dynamo.nvidia.com/gpu-power-limit": "350"},
            "labels": {"nvidia.com/dynamo-graph-deployment-name": "agg", "nvidia.com/dynamo-component": "VllmDecodeWorker"}},
            "spec": {"nodeName": "gpu-0", "containers": [{"name": "main"}]}, "status": {"phase": "Running"}})
        api.apply({**api.get("v1", "Pod", "agg-w-0"), "metadata": {**api.get("v1", "Pod", "agg-w-0")["metadata"],
                                                                   "name": "agg-w-1", "uid": "", "resourceVersion": ""}})
        # written through v1beta1 (KubeCluster's endpoint): its components map, as Dynamo's CRD requires it
        kube.patch_dgd_status("default", "agg", {"observedGeneration": 1, "state": "successful", "components": {
            "VllmDecodeWorker": component_status("agg", "VllmDecodeWorker", 2, ready=2)}})
        state = BudgetState(redis.Redis.from_url(broker_url))
        state.propose("default/agg", {"worker": 9}, at=0, source="test")
        out = evaluate_deployment(kube, state, "default/agg", DeploymentBudget(power_limit_w=5000), None, FakeClock())
        # 700 W per replica (350 W x 2 GPUs): 9 replicas would be 6300 W; 7 fit 5000 W
        assert out.replicas_written == {"VllmDecodeWorker": 7} and out.settled_w == 4900
        stored = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "agg")
        assert stored["spec"]["services"]["VllmDecodeWorker"]["replicas"] == 7
        assert stored["spec"]["services"]["Frontend"] == {"componentType": "frontend", "replicas": 1}
        metrics.record_evaluation("default/agg", out.reason, out.limit_w, out.settled_w, out.peak_w, out.gpus, out.reasons)
        assert REGISTRY.get_sample_value("powerfleet_budget_projected_settled_watts", {"deployment": "default/agg"}) == 4900
        assert REGISTRY.get_sample_value("powerfleet_budget_decisions_total",
                                         {"deployment": "default/agg", "reason": "power_budget_clamped"}) == 1
        kube.close()


def test_tick_limits_from_one_list_each(tmp_path, broker_url):
    from powerfleet.budget.runner import tick_limits
    from powerfleet.config.fleet import DeploymentBudgetConfig

    with ApiServer() as api:
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0", "labels": {"powerfleet.io/rack": "r1"}}})
        for name, counts in (("a", (2, 2)), ("b", (1, 1))):
            api.apply(dgd(name, *counts))
            settle(api, kube, name, ["gpu-0"])
        api.apply(dgd("unplaced", 1, 1))  # no pods yet
        state = BudgetState(redis.Redis.from_url(broker_url))
        state.propose("default/a", {"prefill": 8}, at=0, source="test")
        cfg = {k: DeploymentBudgetConfig(power_limit_w=10_000) for k in ("default/a", "default/b", "default/unplaced",
                                                                         "default/missing")}
        plan = tick_limits(kube, state, cfg, {"r1": 4000}, "powerfleet.io/rack")
        assert plan.skipped == {"default/missing": "not found or unreadable"}
        a, b, unplaced = (plan.limits[f"default/{k}"] for k in ("a", "b", "unplaced"))
        assert (a.group, b.group, unplaced.group) == ("r1", "r1", "(unplaced)") and unplaced.limit_w is None
        assert (a.current_w, b.current_w) == (2000, 1000) and plan.group_current == {"r1": 3000}
        # a wants 5000 W (8 x 500 + 2 x 500) but only the 1000 W free now: it plans against 3000 W
        assert a.limit_w == 3000 and b.limit_w == 1000 and plan.group_peak_bound == {"r1": 4000}
        kube.close()
