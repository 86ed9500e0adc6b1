"""The twin operator: the pure program's rollouts and scheduling, and the writer through the official client."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.cluster.dgd import LABEL_COMPONENT, POWER_ANNOTATION
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.apiserver.options import ServerOptions
from powerfleet.twin.cluster.dgdstatus import CRD_STATUS_KEYS
from powerfleet.twin.fidelity import OperatorSettings
from powerfleet.twin.cluster.manifests import AGG, DISAGG, dgd_manifests
from powerfleet.twin.cluster.operator import GPUS_ANNOTATION, HASH_LABEL, components, pod_gpus, reconcile
from powerfleet.twin.cluster.topology import TwinSpec, node_objects
from powerfleet.twin.cluster.writer import OperatorLoop

SPEC = TwinSpec(nodes=2)
NODES = {n: 8 for n in SPEC.node_names}


def _apply(plan, pods, dgds):
    """Apply a plan to in-memory objects as the API server would (for pure-program tests)."""
    pods = {p["metadata"]["name"]: copy.deepcopy(p) for p in pods}
    for name in plan.deletes:
        pods.pop(name, None)
    for p in plan.creates:
        pods[p["metadata"]["name"]] = copy.deepcopy(p)
    for name, (node, gpus) in plan.placements.items():
        pods[name]["spec"]["nodeName"] = node
        pods[name]["metadata"]["annotations"][GPUS_ANNOTATION] = ",".join(map(str, gpus))
    for name, pod_status in plan.pod_status.items():
        pods[name]["status"] = pod_status
    for d in dgds:
        d["status"] = plan.dgd_status[d["metadata"]["name"]]
    return list(pods.values())


def _settle(dgds, pods, passes=12):
    for _ in range(passes):
        pods = _apply(reconcile(dgds, pods, NODES), pods, dgds)
    return pods


def _with_generation(dgds):
    for d in dgds:
        d["metadata"]["generation"] = d["metadata"].get("generation", 1)
    return dgds


def test_components_read_the_services_form() -> None:
    disagg = dgd_manifests(SPEC)[0]
    comps = {c.name: c for c in components(disagg)}
    assert comps["prefill"].type == "prefill" and comps["prefill"].gpus == 2
    assert comps["planner"].gpus == 0 and comps["decode"].annotations[POWER_ANNOTATION] == "450"


def test_pods_go_pending_running_ready_and_status_settles() -> None:
    dgds = _with_generation(dgd_manifests(SPEC))
    plan = reconcile(dgds, [], NODES)
    assert plan.creates and all(p["status"]["phase"] == "Pending" for p in plan.creates)
    assert plan.dgd_status[DISAGG]["rollingUpdate"]["phase"] == "InProgress"
    pods = _apply(plan, [], dgds)
    pods = _apply(reconcile(dgds, pods, NODES), pods, dgds)
    assert all(p["status"]["phase"] == "Running" for p in pods)
    plan = reconcile(dgds, pods, NODES)
    pods = _apply(plan, pods, dgds)
    final = reconcile(dgds, pods, NODES)
    assert not final.creates and not final.deletes and not final.pod_status
    st = final.dgd_status[AGG]
    assert st["observedGeneration"] == 1 and st["state"] == "successful"
    assert st["services"]["worker"] == {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2,
                                        "componentKind": "Deployment", "componentName": "llm-agg-worker",
                                        "componentNames": ["llm-agg-worker"]}
    assert st["rollingUpdate"]["phase"] == "Completed" and st["rollingUpdate"]["updatedServices"] == ["worker"]
    assert st["conditions"][0]["reason"] == "all_resources_are_ready"
    assert [e.reason for e in final.status_events[AGG]] == ["RolloutCompleted"]


def test_gpus_are_never_double_allocated_and_spread_over_nodes() -> None:
    dgds = _with_generation(dgd_manifests(SPEC))
    pods = _settle(dgds, [])
    used = [(p["spec"]["nodeName"], g) for p in pods for g in pod_gpus(p)]
    assert len(used) == len(set(used)) == 2 * 2 + 1 * 2 + 2 * 1  # prefill 2x2, decode 1x2, worker 2x1
    assert {n for n, _ in used} == set(SPEC.node_names)


def test_template_change_rolls_pods_surge_one_keeping_ready_count() -> None:
    dgds = _with_generation(dgd_manifests(SPEC))
    pods = _settle(dgds, [])
    agg = dgds[1]
    agg["spec"]["services"]["worker"]["extraPodMetadata"]["annotations"][POWER_ANNOTATION] = "400"
    agg["metadata"]["generation"] = 2
    seen_ready = []
    for _ in range(20):
        plan = reconcile(dgds, pods, NODES)
        pods = _apply(plan, pods, dgds)
        workers = [p for p in pods if p["metadata"]["labels"][LABEL_COMPONENT] == "worker"
                   and p["metadata"]["labels"]["nvidia.com/dynamo-graph-deployment-name"] == AGG]
        seen_ready.append(sum(1 for p in workers if any(c["type"] == "Ready" and c["status"] == "True"
                                                         for c in p["status"].get("conditions", []))))
    assert min(seen_ready) >= 2  # maxUnavailable 0
    assert all(p["metadata"]["annotations"][POWER_ANNOTATION] == "400" for p in workers) and len(workers) == 2
    assert dgds[1]["status"]["observedGeneration"] == 2 and dgds[1]["status"]["state"] == "successful"


def test_scale_down_and_unschedulable_pods_wait_for_room() -> None:
    dgds = _with_generation(dgd_manifests(SPEC))
    pods = _settle(dgds, [])
    dgds[1]["spec"]["services"]["worker"]["replicas"] = 20  # 20 GPUs wanted, 16 - 6 (prefill, decode) free
    pods = _settle(dgds, pods)
    workers = [p for p in pods if p["metadata"]["name"].startswith(f"{AGG}-worker")]
    pending = [p for p in workers if not p["spec"].get("nodeName")]
    assert len(workers) == 20 and len(pending) == 10
    assert dgds[1]["status"]["services"]["worker"]["readyReplicas"] == 10
    dgds[1]["spec"]["services"]["worker"]["replicas"] = 1
    pods = _settle(dgds, pods)
    workers = [p for p in pods if p["metadata"]["name"].startswith(f"{AGG}-worker")]
    assert len(workers) == 1 and workers[0]["spec"].get("nodeName")


@pytest.fixture
def twin_api(tmp_path: Path):
    with ApiServer() as api:
        for obj in node_objects(SPEC) + dgd_manifests(SPEC):
            api.apply(obj)
        yield api, str(api.write_kubeconfig(tmp_path / "kubeconfig"))


def test_writer_persists_through_the_official_client_and_skips_unchanged_status(twin_api) -> None:
    api, kubeconfig = twin_api
    loop = OperatorLoop(kubeconfig)
    try:
        for _ in range(4):
            loop.run_once()
        dgd = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", AGG)
        assert dgd["status"]["state"] == "successful" and dgd["status"]["observedGeneration"] == 1
        events = [e["reason"] for e in api.list("v1", "Event")]
        assert events.count("RolloutCompleted") == 2 and "Scheduled" in events
        rv = dgd["metadata"]["resourceVersion"]
        quiet = loop.run_once()
        assert quiet.status_writes == 0 and not quiet.events and not quiet.errors
        assert api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", AGG)["metadata"]["resourceVersion"] == rv
        pods = api.list("v1", "Pod")
        assert all(p["status"]["phase"] == "Running" for p in pods) and all(HASH_LABEL in p["metadata"]["labels"]
                                                                            for p in pods)
    finally:
        loop.stop()


def test_foreign_status_keys_are_kept_only_while_the_fidelity_switch_says_so() -> None:
    dgds = _with_generation(dgd_manifests(SPEC))
    dgds[0]["status"] = {"budget": {"ready": "True", "reason": "Planned"}, "state": "stale"}
    status = reconcile(dgds, [], NODES, settings=OperatorSettings(keep_foreign_status=True)).dgd_status[DISAGG]
    assert status["budget"] == {"ready": "True", "reason": "Planned"} and status["state"] == "pending"
    # As Dynamo's typed Status().Update: the whole status is the operator's; a foreign key vanishes.
    typed = reconcile(dgds, [], NODES, settings=OperatorSettings(keep_foreign_status=False)).dgd_status[DISAGG]
    assert "budget" not in typed and set(typed) <= CRD_STATUS_KEYS


def test_another_controllers_condition_survives_the_operators_status_write() -> None:
    # Dynamo's operator upserts its own conditions by type on the DGD it read and updates that
    # copy, so powerfleet's condition stays where it is; its Ready is replaced in place.
    dgds = _with_generation(dgd_manifests(SPEC))
    budget = {"type": "powerfleet.io/PowerBudget", "status": "True", "reason": "Planned", "message": "within budget",
              "lastTransitionTime": "2026-12-01T10:00:00Z", "observedGeneration": 1}
    dgds[0]["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "x", "message": "",
                                         "lastTransitionTime": "2026-12-01T09:00:00Z"}, budget]}
    status = reconcile(dgds, [], NODES).dgd_status[DISAGG]
    assert [c["type"] for c in status["conditions"]] == ["Ready", "powerfleet.io/PowerBudget"]
    assert status["conditions"][1] == budget and status["conditions"][0]["reason"] == "some_resources_are_not_ready"
    # unchanged on the next pass: the writer skips the write (the status it read is what it wants)
    dgds[0]["status"] = status
    assert reconcile(dgds, [], NODES).dgd_status[DISAGG] == status


def test_pods_turn_ready_only_after_their_startup_delay() -> None:
    dgds = _with_generation(dgd_manifests(SPEC))
    slow = OperatorSettings(startup_delay_s={"worker": 5.0, "*": 0.0})
    pods, now = [], 1_000.0
    for _ in range(4):  # create, start, Ready (frontend), then the status shows it
        pods = _apply(reconcile(dgds, pods, NODES, now=now, settings=slow), pods, dgds)
        now += 1.0
    agg = dgds[1]["status"]["services"]["worker"]
    assert agg["replicas"] == 2 and agg["readyReplicas"] == 0  # a scale-up in flight: spec 2, ready 0
    assert dgds[1]["status"]["state"] == "pending"
    assert dgds[1]["status"]["services"]["frontend"]["readyReplicas"] == 1
    for _ in range(5):
        pods = _apply(reconcile(dgds, pods, NODES, now=now, settings=slow), pods, dgds)
        now += 1.0
    assert dgds[1]["status"]["services"]["worker"]["readyReplicas"] == 2 and dgds[1]["status"]["state"] == "successful"


_json = st.recursive(st.none() | st.booleans() | st.integers(-5, 50) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
                     max_leaves=30)
_dgd = st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"name": st.sampled_from(["a", "b"])}),
                              "spec": st.one_of(_json, st.fixed_dictionaries({"services": _json}),
                                                st.fixed_dictionaries({"components": st.lists(_json, max_size=3)}))})


@settings(max_examples=300, deadline=None)
@given(dgd=_dgd)
def test_the_program_never_raises_on_any_dgd_shape(dgd) -> None:
    # The operator reads what users wrote: a malformed DGD renders what it can, never crashes a pass.
    comps = components(dgd)
    plan = reconcile([dgd], [], {"n": 4})
    assert all(c.replicas >= 0 and c.gpus >= 0 for c in comps)
    assert set(plan.dgd_status) == {dgd["metadata"]["name"]}


def test_a_full_cluster_rolls_out_by_replacing_in_place() -> None:
    one = {"twin-gpu-00": 8}
    dgds = _with_generation(dgd_manifests(TwinSpec(nodes=1)))
    dgds[1]["spec"]["services"]["worker"]["replicas"] = 2  # 4 + 2 + 2 = all 8 GPUs busy
    pods = []
    for _ in range(6):
        pods = _apply(reconcile(dgds, pods, one), pods, dgds)
    dgds[0]["spec"]["services"]["decode"]["extraPodMetadata"]["annotations"][POWER_ANNOTATION] = "380"
    dgds[0]["metadata"]["generation"] = 2
    for _ in range(8):
        pods = _apply(reconcile(dgds, pods, one), pods, dgds)
    decode = [p for p in pods if p["metadata"]["labels"][LABEL_COMPONENT] == "decode"]
    assert len(decode) == 1 and decode[0]["metadata"]["annotations"][POWER_ANNOTATION] == "380"
    assert dgds[0]["status"]["state"] == "successful"


def test_the_operators_status_passes_the_real_status_schema(tmp_path: Path) -> None:
    # With status pruning and validation on (the faithful server), every status write is
    # accepted and nothing foreign is left: the operator writes only what Dynamo's CRD declares.
    with ApiServer(options=ServerOptions(prune_dgd_status=True)) as api:
        for obj in node_objects(SPEC) + dgd_manifests(SPEC):
            api.apply(obj)
        loop = OperatorLoop(str(api.write_kubeconfig(tmp_path / "kc")), settings=OperatorSettings(keep_foreign_status=False))
        try:
            results = [loop.run_once() for _ in range(4)]
        finally:
            loop.stop()
        assert not [e for r in results for e in r.errors]
        status = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", AGG)["status"]
        assert status["state"] == "successful" and set(status) <= CRD_STATUS_KEYS
