"""KubeCluster through the official client against the loopback API server (no client mocks)."""

from __future__ import annotations

import queue
import threading
from datetime import UTC, datetime

import pytest

from powerfleet.cluster.dgd import LABEL_DGD_NAME, POWER_ANNOTATION
from powerfleet.cluster.errors import DGDInputError, PowerInputError
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.objects import Lease, ObjectRef
from powerfleet.cluster.ports import ClusterError, ClusterReader, ClusterWriter, Conflict, InvalidDGD, LeaseConflict, NotFound
from powerfleet.cluster.settlement import settle
from powerfleet.twin.apiserver import ApiServer
from tests.cluster.builders import component, dgd_obj, disagg, pod_obj


def test_kube_cluster_satisfies_both_ports(kube):
    assert isinstance(kube, ClusterReader) and isinstance(kube, ClusterWriter)


def test_lease_lifecycle_and_stale_writes_conflict(kube):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    created = kube.create_lease(Lease(name="retune-llama", namespace="default", holder_identity="w1",
                                      lease_duration_seconds=15, acquire_time=now, renew_time=now, lease_transitions=0))
    assert created.resource_version and created.holder_identity == "w1"
    with pytest.raises(LeaseConflict):
        kube.create_lease(Lease(name="retune-llama", namespace="default", holder_identity="w2"))
    got = kube.get_lease("default", "retune-llama")
    assert got.acquire_time == now and got.lease_duration_seconds == 15
    renewed = kube.update_lease(got.model_copy(update={"renew_time": now.replace(second=5)}))
    assert int(renewed.resource_version) > int(got.resource_version)
    # w2 read the lease before w1 renewed: its takeover must lose, never silently win
    with pytest.raises(LeaseConflict) as info:
        kube.update_lease(got.model_copy(update={"holder_identity": "w2", "lease_transitions": 1}))
    assert info.value.status == 409 and isinstance(info.value, Conflict)
    assert kube.get_lease("default", "retune-llama").holder_identity == "w1"
    with pytest.raises(ValueError):
        kube.update_lease(got.model_copy(update={"resource_version": ""}))
    with pytest.raises(LeaseConflict):
        kube.delete_lease("default", "retune-llama", resource_version=got.resource_version)
    kube.delete_lease("default", "retune-llama", resource_version=renewed.resource_version)
    with pytest.raises(NotFound):
        kube.get_lease("default", "retune-llama")


def test_list_pods_by_label_and_node(api, kube):
    api.apply(pod_obj("a", comp="decode", node="gpu-0"))
    api.apply(pod_obj("b", comp="prefill", node="gpu-1"))
    api.apply(pod_obj("c", dgd="other", comp="decode", node="gpu-0", namespace="team-b"))
    api.apply(pod_obj("d", comp="frontend", node="cpu-0", cap=None, extra_labels={"tier": "edge"}))
    names = lambda pods: sorted(p.name for p in pods)  # noqa: E731
    assert names(kube.list_pods("default", label_selector=f"{LABEL_DGD_NAME}=llama")) == ["a", "b", "d"]
    assert names(kube.list_pods(label_selector="nvidia.com/dynamo-component in (decode, prefill)")) == ["a", "b", "c"]
    assert names(kube.list_pods(label_selector="nvidia.com/dynamo-component notin (decode),!tier")) == ["b"]
    assert names(kube.list_pods(label_selector="tier")) == ["d"]
    assert names(kube.list_pods(label_selector=f"{LABEL_DGD_NAME}!=llama")) == ["c"]
    assert names(kube.list_pods(node_name="gpu-0")) == ["a", "c"]
    assert names(kube.list_pods("default", node_name="gpu-0")) == ["a"]
    assert kube.list_pods(node_name="nowhere") == []
    pod = kube.list_pods(node_name="gpu-1")[0]
    assert pod.annotations[POWER_ANNOTATION] == "300" and pod.phase == "Running" and pod.uid and not pod.terminating


def test_dgd_read_list_and_invalid_ones_fail_alone(api, kube):
    api.apply(disagg())
    api.apply(dgd_obj(component("x", "embedder"), name="broken"))
    dgd = kube.get_dgd("default", "llama")
    assert dgd.uid and dgd.generation == 1 and dgd.component("decode").gpus_per_pod == 4
    listed = kube.list_dgds("default")
    assert [type(d).__name__ for d in listed] == ["InvalidDGD", "DGD"]
    bad = listed[0]
    assert isinstance(bad, InvalidDGD) and bad.name == "broken" and bad.path == "spec.components[name=x].type"
    assert len(kube.list_dgds()) == 2 and kube.list_dgds("elsewhere") == []
    with pytest.raises(NotFound):
        kube.get_dgd("default", "missing")
    with pytest.raises(DGDInputError):
        kube.get_dgd("default", "broken")


def test_dgd_status_subresource(api, kube):
    api.apply(disagg())
    # A status field Dynamo's CRD declares (restart), so the test holds whether or not the
    # server prunes foreign status keys (twin/fidelity.py).
    stored = kube.patch_dgd_status("default", "llama", {"restart": {"phase": "Admitted"}, "observedGeneration": 1})
    assert stored["status"]["restart"] == {"phase": "Admitted"}
    assert stored["metadata"]["generation"] == 1  # a status write is not a spec change
    # the main endpoint ignores status changes for a resource with a status subresource
    obj = kube.get_dgd_object("default", "llama")
    obj["status"] = {"restart": {"phase": "hacked"}}
    replaced = kube.custom.replace_namespaced_custom_object("nvidia.com", kube.dgd_version(), "default",
                                                            "dynamographdeployments", "llama", obj)
    assert replaced["status"]["restart"] == {"phase": "Admitted"}
    patched = kube.patch_dgd_status("default", "llama", {"restart": None})
    assert "restart" not in patched["status"] and patched["status"]["observedGeneration"] == 1


def test_patch_replicas_is_fenced_and_bumps_generation(api, kube):
    api.apply(disagg())
    before = kube.get_dgd("default", "llama")
    after = kube.patch_dgd_replicas("default", "llama", {"decode": 3, "prefill": 1})
    assert (after.component("decode").replicas, after.component("prefill").replicas) == (3, 1)
    # Stored as v1alpha1's map, served back as a list in name order (as a Go map marshals).
    assert after.generation == 2 and [c.name for c in after.components] == ["decode", "frontend", "prefill"]
    with pytest.raises(Conflict):
        kube.patch_dgd_replicas("default", "llama", {"decode": 5}, resource_version=before.resource_version)
    assert kube.get_dgd("default", "llama").component("decode").replicas == 3
    with pytest.raises(NotFound):
        kube.patch_dgd_replicas("default", "llama", {"nope": 1})


@pytest.mark.parametrize(
    "obj",
    [
        disagg(decode_cap=None),
        disagg(decode_cap="3.5e2"),
        dgd_obj(component("p", "prefill", cap="1", gpus=0), component("d", "decode", cap="1")),
        dgd_obj(component("x", "embedder", cap="1")),
    ],
)
def test_bad_dgd_writes_nothing(api, kube, obj):
    api.apply(obj)
    before = api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "llama")
    with pytest.raises(DGDInputError) as info:
        dgd = kube.get_dgd("default", "llama")
        settle(dgd, kube.list_pods("default", label_selector=dgd.pod_selector))
    assert info.value.component and info.value.path.startswith("spec.components[name=")
    if not isinstance(info.value, PowerInputError):
        with pytest.raises(DGDInputError):
            kube.patch_dgd_replicas("default", "llama", {"x": 2})
    assert api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "llama") == before


def test_record_and_list_events(kube):
    ref = ObjectRef(kind="DynamoGraphDeployment", name="llama", namespace="default", api_version="nvidia.com/v1alpha1")
    ev = kube.record_event(ref, "PowerInputsChanged", "decode cap changed", type="Warning")
    assert ev.reason == "PowerInputsChanged" and ev.type == "Warning" and ev.name.startswith("llama.")
    kube.record_event(ObjectRef(kind="Pod", name="p", namespace="default"), "Other", "x")
    [listed] = kube.list_events("default", involved_name="llama")
    assert listed.involved == ref and listed.message == "decode cap changed"
    assert len(kube.list_events("default")) == 2


def test_watch_sees_annotation_change(api, kube):
    api.apply(pod_obj("decode-0", node="gpu-0"))
    api.apply(pod_obj("decode-9", node="gpu-9"))
    start_rv = kube.list_pods("default")[0].resource_version  # anything; resume below uses the list's view
    events: queue.Queue = queue.Queue()

    def consume():
        for ev in kube.watch_pods("default", node_name="gpu-0", timeout_seconds=20):
            events.put(ev)
            if ev.type == "MODIFIED":
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    first = events.get(timeout=10)
    assert (first.type, first.pod.name) == ("ADDED", "decode-0")
    kube.core.patch_namespaced_pod("decode-9", "default", {"metadata": {"annotations": {POWER_ANNOTATION: "1"}}})
    kube.core.patch_namespaced_pod("decode-0", "default", {"metadata": {"annotations": {POWER_ANNOTATION: "250"}}})
    changed = events.get(timeout=10)
    assert (changed.type, changed.pod.name, changed.pod.annotations[POWER_ANNOTATION]) == ("MODIFIED", "decode-0", "250")
    t.join(timeout=10)
    assert not t.is_alive()
    # resuming from a resourceVersion replays only what came after it
    resumed = kube.watch_pods("default", resource_version=start_rv, timeout_seconds=1)
    seen = [(e.type, e.pod.name) for e in resumed]
    assert ("MODIFIED", "decode-0") in seen and ("ADDED", "decode-0") not in seen


def test_persistence_round_trip(tmp_path):
    state = tmp_path / "cluster.json"
    with ApiServer(persist_path=state) as api:
        api.write_kubeconfig(tmp_path / "kc")
        kube = KubeCluster.from_kubeconfig(str(tmp_path / "kc"))
        api.apply(disagg())
        kube.create_lease(Lease(name="l", namespace="default", holder_identity="a"))
        kube.patch_dgd_status("default", "llama", {"state": "pending"})  # a value the CRD's enum allows
        lease_rv = kube.get_lease("default", "l").resource_version
        kube.close()
    assert state.exists() and not (tmp_path / "cluster.json.tmp").exists()
    with ApiServer(persist_path=state) as api:
        api.write_kubeconfig(tmp_path / "kc")
        kube = KubeCluster.from_kubeconfig(str(tmp_path / "kc"))
        dgd = kube.get_dgd("default", "llama")
        assert dgd.component("decode").power_annotation == "300"
        lease = kube.get_lease("default", "l")
        assert lease.resource_version == lease_rv
        kube.update_lease(lease.model_copy(update={"holder_identity": "b"}))
        assert int(kube.get_lease("default", "l").resource_version) > int(lease_rv)  # counter resumed
        kube.close()


def test_transport_failure_is_a_cluster_error(tmp_path):
    api = ApiServer().start()
    api.write_kubeconfig(tmp_path / "kc")
    api.stop()
    kube = KubeCluster.from_kubeconfig(str(tmp_path / "kc"))
    kube.api_client.configuration.retries = 0
    with pytest.raises(ClusterError):
        kube.list_pods(node_name="gpu-0")


def test_watch_from_a_compacted_version_is_a_410_cluster_error(api, kube):
    for i in range(3):
        api.apply(pod_obj(f"p{i}"))
    api.store.log.clear()  # as if the event log had been compacted
    api.apply(pod_obj("late"))
    with pytest.raises(ClusterError) as info:
        list(kube.watch_pods("default", resource_version="1", timeout_seconds=5))
    assert info.value.status == 410
