"""The agent's enforcement-report annotation patch under the chart's ValidatingAdmissionPolicy,
evaluated by the real API server: accepted on a pod of the agent's own node (its pod-bound token's
node-name claim), refused on another node's pod, refused when anything but the report changes, and
refused for a token bound to no pod. tests/charts checks the same expressions with a CEL library."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.ports import ClusterError
from tests.control_plane.cluster import admin_client
from tests.control_plane.fleet import FleetRbac
from tests.waiting import wait_for

REPORT = "dynamo.nvidia.com/gpu-power-enforcement-report"
CAP = "dynamo.nvidia.com/gpu-power-limit"


def _pod(name: str, node: str, annotations: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, annotations=annotations, labels={"app": name}),
                        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="c", image="x")],
                                              tolerations=[client.V1Toleration(operator="Exists")]))


@pytest.fixture(scope="module")
def world(control_plane, fake_nodes, tmp_path_factory) -> Iterator[tuple[FleetRbac, dict[str, client.V1Pod]]]:  # type: ignore[no-untyped-def]
    fleet = FleetRbac.install(control_plane, tmp_path_factory.mktemp("vap"), values={})
    admin = admin_client(control_plane)
    core = client.CoreV1Api(admin)
    pods = {name: core.create_namespaced_pod(fleet.namespace, _pod(name, node, ann))
            for name, node, ann in (("agent-a", "gpu-a-1", None), ("llm-a", "gpu-a-1", {CAP: "450"}),
                                    ("llm-b", "gpu-b-1", {CAP: "450"}))}
    # The policy is enforced once the server has loaded it (it watches policies and bindings).
    probe = KubeCluster(fleet.client("agent", bound_pod=pods["agent-a"]))
    wait_for(lambda: _refused(lambda: probe.patch_pod_annotations(
        fleet.namespace, "llm-a", {"other": "x"}, uid=pods["llm-a"].metadata.uid)), "the policy enforced",
        timeout_s=30)
    yield fleet, pods
    admin.close()
    fleet.close()


def _refused(call) -> str:  # type: ignore[no-untyped-def]
    try:
        call()
    except ClusterError as exc:
        return str(exc) if exc.status in (403, 422) else ""
    except ApiException as exc:
        return str(exc.body) if exc.status in (403, 422) else ""
    return ""


def test_the_report_patch_is_accepted_on_a_pod_of_the_agents_own_node(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    kube = KubeCluster(fleet.client("agent", bound_pod=pods["agent-a"]))
    written = kube.patch_pod_annotations(fleet.namespace, "llm-a", {REPORT: '{"applied_w": 450}'},
                                         uid=pods["llm-a"].metadata.uid)
    assert written.annotations[REPORT] == '{"applied_w": 450}' and written.annotations[CAP] == "450", written


def test_the_report_patch_is_refused_on_another_nodes_pod(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    kube = KubeCluster(fleet.client("agent", bound_pod=pods["agent-a"]))
    why = _refused(lambda: kube.patch_pod_annotations(fleet.namespace, "llm-b", {REPORT: "{}"},
                                                      uid=pods["llm-b"].metadata.uid))
    assert "only pods on its own node" in why, why


def test_any_other_change_by_the_agent_is_refused_even_on_its_own_node(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    kube = KubeCluster(fleet.client("agent", bound_pod=pods["agent-a"]))
    uid = pods["llm-a"].metadata.uid
    why = _refused(lambda: kube.patch_pod_annotations(fleet.namespace, "llm-a", {CAP: "700"}, uid=uid))
    assert "may change only the annotation" in why, why
    why = _refused(lambda: kube.core.patch_namespaced_pod("llm-a", fleet.namespace,
                                                          {"metadata": {"labels": {"app": "moved"}}}))
    assert "may not change a pod's spec, labels" in why, why


def test_a_token_bound_to_no_pod_carries_no_node_and_is_refused(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    kube = KubeCluster(fleet.client("agent"))
    why = _refused(lambda: kube.patch_pod_annotations(fleet.namespace, "llm-a", {REPORT: "{}"},
                                                      uid=pods["llm-a"].metadata.uid))
    assert "only pods on its own node" in why, why


def test_the_policy_does_not_apply_to_other_users(world) -> None:  # type: ignore[no-untyped-def]
    fleet, _ = world
    admin = admin_client(fleet.plane)
    try:
        patched = client.CoreV1Api(admin).patch_namespaced_pod("llm-b", fleet.namespace,
                                                               {"metadata": {"labels": {"x": "y"}}})
    finally:
        admin.close()
    assert patched.metadata.labels["x"] == "y", patched.metadata
