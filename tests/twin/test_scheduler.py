"""The twin's scheduler (twin/cluster/scheduler.py) filters as kube-scheduler does: cordons, nodeSelector,
required node affinity, taints and tolerations, allocatable nvidia.com/gpu; a pod that fits
nowhere stays Pending with PodScheduled=False (Unschedulable) and is bound once room appears."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.twin.cluster.operator import GPUS_ANNOTATION, reconcile
from powerfleet.twin.cluster.scheduler import NodeView, Scheduler, node_view, pod_gpu_indices, tolerates
from tests.twin.test_operator import _apply

RACK = "powerfleet.io/rack"
NODES = [NodeView("a1", 4, {RACK: "rack-a"}), NodeView("a2", 4, {RACK: "rack-a"}),
         NodeView("b1", 4, {RACK: "rack-b"}, ({"key": "gpu", "value": "reserved", "effect": "NoSchedule"},)),
         NodeView("b2", 4, {RACK: "rack-b"}, ({"key": "slow", "effect": "PreferNoSchedule"},), unschedulable=True)]


def spec(gpus: int = 1, **extra) -> dict:
    return {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}], **extra}


def bound(name: str, node: str, gpus: int, indices: bool = True) -> dict:
    ann = {GPUS_ANNOTATION: ",".join(map(str, range(gpus)))} if indices else {}
    return {"metadata": {"name": name, "annotations": ann}, "spec": {**spec(gpus), "nodeName": node},
            "status": {"phase": "Running"}}


def test_node_selector_and_required_affinity_choose_the_nodes():
    s = Scheduler(NODES, [])
    assert s.place(spec(nodeSelector={RACK: "rack-a"}), 1)[0] in ("a1", "a2")
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": RACK, "operator": "NotIn", "values": ["rack-a"]}]}]}}}
    why = s.place(spec(affinity=affinity), 1)
    assert isinstance(why, str) and "2 node(s) didn't match Pod's node affinity/selector" in why, why


def test_taints_need_tolerations_and_cordons_keep_pods_off():
    s = Scheduler(NODES, [])
    only_b = {"nodeSelector": {RACK: "rack-b"}}
    why = s.place(spec(**only_b), 1)
    assert why == ("0/4 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 node(s) had "
                   "untolerated taint {gpu: reserved}, 1 node(s) were unschedulable. preemption: 0/4 nodes are "
                   "available: 4 Preemption is not helpful for scheduling."), why
    tol = [{"key": "gpu", "operator": "Equal", "value": "reserved", "effect": "NoSchedule"}]
    assert s.place(spec(tolerations=tol, **only_b), 1)[0] == "b1"
    assert s.place(spec(tolerations=[{"operator": "Exists"}], **only_b), 1)[0] in ("b1", "b2")  # tolerates all


def test_toleration_matching_follows_kubernetes():
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert tolerates([{"key": "k", "operator": "Exists"}], taint)
    assert tolerates([{"key": "k", "value": "v"}], taint)  # operator defaults to Equal
    assert not tolerates([{"key": "k", "value": "w"}], taint)
    assert not tolerates([{"key": "k", "operator": "Exists", "effect": "NoSchedule"}], taint)
    assert not tolerates([{"value": "v"}], taint)  # no key needs Exists


def test_gpus_are_allocatable_minus_what_bound_pods_request():
    # a1: 3 of 4 taken by a pod with indices; a2: 4 of 4 by one without (created by someone else)
    s = Scheduler(NODES[:2], [bound("x", "a1", 3), bound("y", "a2", 4, indices=False)])
    why = s.place(spec(2), 2)
    assert isinstance(why, str) and "2 Insufficient nvidia.com/gpu" in why, why
    assert s.place(spec(1), 1) == ("a1", [3])
    assert isinstance(s.place(spec(1), 1), str)


def _dgd(replicas: int, gpus: int, **pod_spec) -> dict:
    return {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": "d", "namespace": "default", "generation": 1},
            "spec": {"components": [{"name": "worker", "type": "worker", "replicas": replicas, "podTemplate": {
                "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                         **pod_spec}}}]}}


def test_a_pod_that_fits_nowhere_stays_pending_and_is_bound_when_room_appears():
    nodes = [NodeView("a1", 4, {RACK: "rack-a"}), NodeView("b1", 4, {RACK: "rack-b"})]
    dgd = _dgd(3, 2, nodeSelector={RACK: "rack-a"})  # 6 GPUs wanted on rack-a's 4
    tenant = bound("tenant", "a1", 0)
    pods = _apply(reconcile([dgd], [tenant], nodes), [tenant], [dgd])
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    assert len(pending) == 1 and pending[0]["spec"]["nodeSelector"] == {RACK: "rack-a"}, pods
    cond = pending[0]["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable"), cond
    assert "1 Insufficient nvidia.com/gpu" in cond["message"] and "1 node(s) didn't match" in cond["message"], cond
    assert all(p["spec"]["nodeName"] == "a1" for p in pods if p["spec"].get("nodeName") and p is not tenant)
    for _ in range(3):  # nothing frees: it stays Pending
        pods = _apply(reconcile([dgd], pods, nodes), pods, [dgd])
    assert sum(1 for p in pods if not p["spec"].get("nodeName")) == 1
    nodes[1] = NodeView("b1", 4, {RACK: "rack-a"})  # a node joins rack-a: room appears
    pods = _apply(reconcile([dgd], pods, nodes), pods, [dgd])
    assert all(p["spec"].get("nodeName") for p in pods), pods


def test_an_unowned_pending_pod_is_bound_once_a_node_matches_then_started():
    queued = {"metadata": {"name": "queued", "annotations": {}, "labels": {}},
              "spec": spec(2, nodeSelector={"pool": "training"}), "status": {"phase": "Pending"}}
    nodes = [NodeView("a1", 4, {RACK: "rack-a"})]
    pods = _apply(reconcile([], [queued], nodes), [queued], [])
    assert not pods[0]["spec"].get("nodeName")
    nodes = [NodeView("a1", 4, {RACK: "rack-a", "pool": "training"})]
    pods = _apply(reconcile([], pods, nodes), pods, [])
    assert pods[0]["spec"]["nodeName"] == "a1" and pod_gpu_indices(pods[0]) == [0, 1], pods
    pods = _apply(reconcile([], pods, nodes), pods, [])
    assert pods[0]["status"]["phase"] == "Running", pods


def test_node_view_reads_what_the_api_serves():
    v = node_view({"metadata": {"name": "n", "labels": {RACK: "rack-a"}},
                   "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": True},
                   "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert v == NodeView("n", 8, {RACK: "rack-a"}, ({"key": "k", "effect": "NoSchedule"},), True)


_node = st.builds(lambda i, gpus, rack, tainted: NodeView(
    f"n{i}", gpus, {RACK: rack}, ({"key": "t", "effect": "NoSchedule"},) if tainted else ()),
    st.integers(0, 10**6), st.integers(0, 8), st.sampled_from(["rack-a", "rack-b"]), st.booleans())
_pod = st.tuples(st.integers(0, 4), st.sampled_from([None, "rack-a", "rack-b"]), st.booleans())


@given(st.lists(_node, min_size=1, max_size=5, unique_by=lambda n: n.name), st.lists(_pod, max_size=20))
@settings(max_examples=200, deadline=None)
def test_no_binding_breaks_a_filter_or_overcommits_a_node(nodes, pods):
    s = Scheduler(nodes, [])
    held = {n.name: 0 for n in nodes}
    by_name = {n.name: n for n in nodes}
    for gpus, rack, tolerant in pods:
        pod_spec = spec(gpus, **({"nodeSelector": {RACK: rack}} if rack else {}),
                        **({"tolerations": [{"key": "t", "operator": "Exists"}]} if tolerant else {}))
        got = s.place(pod_spec, gpus)
        fits = [n for n in nodes if (rack is None or n.labels[RACK] == rack) and (tolerant or not n.taints)
                and n.gpus - held[n.name] >= gpus]
        if isinstance(got, str):
            assert not fits and got.startswith(f"0/{len(nodes)} nodes are available"), (got, fits)
            continue
        node, indices = got
        assert by_name[node] in fits and len(indices) == gpus, (got, fits)
        held[node] += gpus
        assert held[node] <= by_name[node].gpus
