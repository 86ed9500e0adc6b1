"""409/422/415/413, pruning and validation of Dynamo's CRD, the status subresource and graceful
deletion: the same official-client calls against the loopback server and the real kube-apiserver,
asserting the same status codes, reasons, stored objects and field paths (docs/twin.md's fidelity
table; the differences left are listed there)."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes import client

from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.objects import Lease
from tests.control_plane.servers import GROUP, PLURAL, Server, fails, pod


def test_create_of_an_existing_name_is_409_already_exists(server: Server) -> None:
    server.core.create_namespaced_pod(server.namespace, pod("p"))
    body = fails(lambda: server.core.create_namespaced_pod(server.namespace, pod("p")), 409)
    assert body["reason"] == "AlreadyExists" and body["details"]["name"] == "p", body
    assert body["details"]["kind"] == "pods", body


def test_an_update_from_a_stale_version_is_409_conflict(server: Server) -> None:
    server.core.create_namespaced_config_map(server.namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="c"), data={"a": "1"}))
    read = server.core.read_namespaced_config_map("c", server.namespace)
    read.data = {"a": "2"}
    server.core.replace_namespaced_config_map("c", server.namespace, read)
    read.data = {"a": "3"}  # still the old resourceVersion
    body = fails(lambda: server.core.replace_namespaced_config_map("c", server.namespace, read), 409)
    assert body["reason"] == "Conflict" and "the object has been modified" in body["message"], body
    assert server.core.read_namespaced_config_map("c", server.namespace).data == {"a": "2"}


def test_names_labels_and_annotations_over_their_limits_are_422_naming_the_field(server: Server) -> None:
    ns = server.namespace
    body = fails(lambda: server.core.create_namespaced_pod(ns, pod("x" * 254)), 422)
    assert body["reason"] == "Invalid" and "metadata.name" in {c["field"] for c in body["details"]["causes"]}, body
    body = fails(lambda: server.core.create_namespaced_pod(ns, pod("Upper_case")), 422)
    assert {c["field"] for c in body["details"]["causes"]} == {"metadata.name"}, body
    body = fails(lambda: server.core.create_namespaced_pod(ns, pod("l", labels={"a": "v" * 64})), 422)
    assert {c["field"] for c in body["details"]["causes"]} == {"metadata.labels"}, body
    body = fails(lambda: server.core.create_namespaced_pod(ns, pod("a", annotations={"a": "v" * (256 * 1024)})), 422)
    assert {c["field"] for c in body["details"]["causes"]} == {"metadata.annotations"}, body
    server.core.create_namespaced_pod(ns, pod("ok", annotations={"a": "v" * (200 * 1024)}))  # under the limit


def test_a_body_over_3_mib_is_413(server: Server) -> None:
    code, body, _ = server.call("POST", f"/api/v1/namespaces/{server.namespace}/pods",
                                {"kind": "Pod", "padding": " " * (3 * 1024 * 1024)})
    assert code == 413 and body["reason"] == "RequestEntityTooLarge", (code, body)


def test_strategic_merge_patch_of_a_custom_resource_is_415(server: Server) -> None:
    server.create_dgd(server.dgd())
    body = fails(lambda: server.custom.patch_namespaced_custom_object(
        GROUP, "v1alpha1", server.namespace, PLURAL, "llm", {"spec": {"services": {"decode": {"replicas": 2}}}},
        _content_type="application/strategic-merge-patch+json"), 415)
    assert body["reason"] == "UnsupportedMediaType", body
    merged = server.custom.patch_namespaced_custom_object(GROUP, "v1alpha1", server.namespace, PLURAL, "llm",
                                                          {"spec": {"services": {"decode": {"replicas": 2}}}})
    assert merged["spec"]["services"]["decode"]["replicas"] == 2, merged


def test_a_failed_json_patch_test_op_is_422_and_changes_nothing(server: Server) -> None:
    server.create_dgd(server.dgd())
    ops = [{"op": "test", "path": "/spec/services/decode/replicas", "value": 7},
           {"op": "replace", "path": "/spec/services/decode/replicas", "value": 3}]
    code, body, _ = server.call("PATCH", server.dgd_path("llm"), ops, "application/json-patch+json")
    assert code == 422 and body["reason"] == "Invalid", (code, body)
    ops[0]["value"] = 1
    code, body, _ = server.call("PATCH", server.dgd_path("llm"), ops, "application/json-patch+json")
    assert code == 200 and body["spec"]["services"]["decode"]["replicas"] == 3, (code, body)


def test_unknown_dgd_fields_are_pruned_with_a_warning_or_400_when_strict(server: Server) -> None:
    code, body, headers = server.call("POST", server.dgd_path(), server.dgd(bogus={"x": 1}))
    assert code == 201 and "bogus" not in body["spec"], (code, body)
    assert headers.get("Warning") == '299 - "unknown field \\"spec.bogus\\""', headers
    body = fails(lambda: server.create_dgd(server.dgd("other", bogus=1), field_validation="Strict"), 400)
    assert body["message"] == ('DynamoGraphDeployment in version "v1alpha1" cannot be handled as a '
                               'DynamoGraphDeployment: strict decoding error: unknown field "spec.bogus"'), body
    quiet = server.create_dgd(server.dgd("third", bogus=1), field_validation="Ignore")
    assert "bogus" not in quiet["spec"], quiet


def test_types_enums_and_bounds_are_422_naming_each_path(server: Server) -> None:
    bad = server.dgd()
    bad["spec"]["services"]["decode"]["replicas"] = -1
    bad["spec"]["backendFramework"] = "onnx"
    body = fails(lambda: server.create_dgd(bad), 422)
    assert body["reason"] == "Invalid", body
    assert {c["field"] for c in body["details"]["causes"]} == {"spec.services.decode.replicas",
                                                               "spec.backendFramework"}, body


def test_the_status_subresource_splits_spec_and_status_writes(server: Server) -> None:
    created = server.create_dgd(server.dgd())
    assert created.get("status", {}).get("state") in (None, "initializing"), created
    ns, custom = server.namespace, server.custom
    # A status write through the main resource is ignored; a spec write through /status is ignored.
    custom.patch_namespaced_custom_object(GROUP, "v1alpha1", ns, PLURAL, "llm", {"status": {"state": "successful"}})
    assert custom.get_namespaced_custom_object(GROUP, "v1alpha1", ns, PLURAL, "llm").get("status", {}).get(
        "state") != "successful"
    written = custom.patch_namespaced_custom_object_status(
        GROUP, "v1alpha1", ns, PLURAL, "llm",
        {"status": {"state": "successful", "budget": {"x": 1}}, "spec": {"services": {"decode": {"replicas": 5}}}})
    assert written["status"]["state"] == "successful" and "budget" not in written["status"], written
    assert written["spec"]["services"]["decode"]["replicas"] == 1, written
    body = fails(lambda: custom.patch_namespaced_custom_object_status(
        GROUP, "v1alpha1", ns, PLURAL, "llm", {"status": {"state": "done"}}), 422)
    assert {c["field"] for c in body["details"]["causes"]} == {"status.state"}, body


def test_a_status_write_leaves_generation_and_a_spec_write_bumps_it(server: Server) -> None:
    g0 = server.create_dgd(server.dgd())["metadata"]["generation"]
    ns, custom = server.namespace, server.custom
    after_status = custom.patch_namespaced_custom_object_status(GROUP, "v1alpha1", ns, PLURAL, "llm",
                                                                {"status": {"observedGeneration": g0}})
    assert after_status["metadata"]["generation"] == g0, after_status["metadata"]
    after_spec = custom.patch_namespaced_custom_object(GROUP, "v1alpha1", ns, PLURAL, "llm",
                                                       {"spec": {"services": {"decode": {"replicas": 2}}}})
    assert after_spec["metadata"]["generation"] == g0 + 1, after_spec["metadata"]


def test_deleting_a_scheduled_pod_is_graceful_and_grace_zero_removes_it(server: Server) -> None:
    ns = server.namespace
    server.core.create_namespaced_pod(ns, pod("sched", node="gpu-x"))
    server.core.create_namespaced_pod(ns, pod("unsched"))
    server.core.delete_namespaced_pod("sched", ns)
    held = server.core.read_namespaced_pod("sched", ns)
    assert held.metadata.deletion_timestamp is not None and held.metadata.deletion_grace_period_seconds == 30, \
        held.metadata
    server.core.delete_namespaced_pod("unsched", ns)  # never scheduled: nothing to wait for
    fails(lambda: server.core.read_namespaced_pod("unsched", ns), 404)
    server.core.delete_namespaced_pod("sched", ns, grace_period_seconds=0)
    fails(lambda: server.core.read_namespaced_pod("sched", ns), 404)


def test_a_delete_with_a_stale_precondition_is_409(server: Server) -> None:
    first = server.core.create_namespaced_config_map(server.namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="c"), data={"a": "1"}))
    server.core.patch_namespaced_config_map("c", server.namespace, {"data": {"a": "2"}})
    opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=first.metadata.resource_version))
    body = fails(lambda: server.core.delete_namespaced_config_map("c", server.namespace, body=opts), 409)
    assert body["reason"] == "Conflict" and body["message"].startswith(
        'Operation cannot be fulfilled on ConfigMap "c": the ResourceVersion in the precondition ('), body


def test_server_side_apply_is_the_listed_difference(server: Server) -> None:
    # docs/twin.md: the loopback server answers 415 (the fleet never applies); the real one applies.
    server.core.create_namespaced_config_map(server.namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="ssa")))
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}}
    code, body, _ = server.call("PATCH", f"/api/v1/namespaces/{server.namespace}/configmaps/ssa", manifest,
                                "application/apply-patch+yaml", query=[("fieldManager", "t")])
    expected = 200 if server.kind == "real" else 415
    assert code == expected, (server.kind, code, body)


def test_a_lease_time_without_microseconds_is_400_and_the_adapter_always_sends_them(server: Server) -> None:
    """A MicroTime is parsed as RFC3339Micro: the client's isoformat of a whole second (no fraction)
    made every Lease the retune's injected clock stamped a 400 on the real server."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{server.namespace}/leases"
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
             "spec": {"holderIdentity": "a", "renewTime": "2027-01-15T08:00:00+00:00"}}
    code, body, _ = server.call("POST", path, lease)
    assert (code, body.get("reason")) == (400, "BadRequest") and "cannot be handled as a Lease" in body["message"], body
    at = datetime.fromtimestamp(1_800_000_000.0, UTC)  # a whole second, as a FakeClock gives
    made = KubeCluster(server.api).create_lease(Lease(name="l", namespace=server.namespace, holder_identity="a",
                                                      acquire_time=at, renew_time=at, lease_transitions=1))
    assert (made.acquire_time, made.renew_time) == (at, at), made


def test_a_pod_is_bound_once_through_pods_binding(server: Server) -> None:
    """The twin's operator binds as a scheduler does: a real server refuses a change of spec.nodeName."""
    server.core.create_namespaced_pod(server.namespace, pod("p"))
    binding = lambda node: client.V1Binding(metadata=client.V1ObjectMeta(name="p"),  # noqa: E731
                                            target=client.V1ObjectReference(kind="Node", name=node))
    done = server.core.create_namespaced_pod_binding("p", server.namespace, binding("n1"), _preload_content=False)
    assert done.status == 201, done.data
    bound = server.core.read_namespaced_pod("p", server.namespace)
    scheduled = [(c.type, c.status) for c in bound.status.conditions or [] if c.type == "PodScheduled"]
    assert bound.spec.node_name == "n1" and scheduled == [("PodScheduled", "True")], bound.status
    body = fails(lambda: server.core.create_namespaced_pod_binding("p", server.namespace, binding("n2"),
                                                                   _preload_content=False), 409)
    assert body["reason"] == "Conflict" and body["details"]["kind"] == "pods/binding", body
    assert 'already assigned to node "n1"' in body["message"], body
