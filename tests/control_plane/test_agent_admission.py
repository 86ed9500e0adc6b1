"""The agent's enforcement-report annotation patch under the chart's ValidatingAdmissionPolicy,
evaluated by the real API server: accepted on a pod of the agent's own node (its pod-bound token's
node-name claim), refused on another node's pod, refused when anything but the report changes, and
refused for a token bound to no pod. tests/charts checks the same expressions with a CEL library."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.pod_annotations import KubePodAnnotations
from powerfleet.cluster.ports import ClusterError
from tests.control_plane.cluster import admin_client
from tests.control_plane.fleet import SA, FleetRbac
from tests.waiting import wait_for

REPORT = "dynamo.nvidia.com/gpu-power-enforcement-report"
CAP = "dynamo.nvidia.com/gpu-power-limit"


def _pod(name: str, node: str, annotations: dict[str, str] | None = None, sa: str | None = None) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, annotations=annotations, labels={"app": name}),
                        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="c", image="x")],
                                              service_account_name=sa,
                                              tolerations=[client.V1Toleration(operator="Exists")]))


@pytest.fixture(scope="module")
def world(control_plane, fake_nodes, tmp_path_factory) -> Iterator[tuple[FleetRbac, dict[str, client.V1Pod]]]:  # type: ignore[no-untyped-def]
    fleet = FleetRbac.install(control_plane, tmp_path_factory.mktemp("vap"), values={})
    admin = admin_client(control_plane)
    core = client.CoreV1Api(admin)
    pods = {name: core.create_namespaced_pod(fleet.namespace, _pod(name, node, ann, sa))
            for name, node, ann, sa in (("agent-a", "gpu-a-1", None, SA["agent"]), ("llm-a", "gpu-a-1", {CAP: "450"}, None),
                                        ("llm-b", "gpu-b-1", {CAP: "450"}, None))}
    # The policy is enforced once the server has loaded it (it watches policies and bindings). The
    # probe is refused by the node rule whatever it changes, so an early success alters nothing the tests read.
    agent = client.CoreV1Api(fleet.client("agent", bound_pod=pods["agent-a"]))
    wait_for(lambda: _refused(agent, fleet.namespace, pods["llm-b"], {REPORT: "probe"}), "the policy enforced",
             timeout_s=30)
    yield fleet, pods
    admin.close()
    fleet.close()


def _refused(core: client.CoreV1Api, ns: str, pod: client.V1Pod, annotations: dict[str, str],
             labels: dict[str, str] | None = None) -> str:
    """The policy's message when the server refuses the agent's patch (the adapter's body:
    KubePodAnnotations.patch_pod_annotations), else ''."""
    meta: dict[str, object] = {"uid": pod.metadata.uid, "annotations": annotations}
    if labels:
        meta["labels"] = labels
    try:
        core.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": meta},
                                  _content_type="application/merge-patch+json")
    except ApiException as exc:
        return json.loads(exc.body)["message"] if exc.status == 403 else ""
    return ""


def test_the_report_patch_is_accepted_on_a_pod_of_the_agents_own_node(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    kube = KubePodAnnotations(KubeCluster(fleet.client("agent", bound_pod=pods["agent-a"])))
    written = kube.patch_pod_annotations(fleet.namespace, "llm-a", {REPORT: '{"applied_w": 450}'},
                                         uid=pods["llm-a"].metadata.uid)
    assert written.annotations[REPORT] == '{"applied_w": 450}' and written.annotations[CAP] == "450", written


def test_the_report_patch_is_refused_on_another_nodes_pod(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    kube = KubePodAnnotations(KubeCluster(fleet.client("agent", bound_pod=pods["agent-a"])))
    with pytest.raises(ClusterError) as info:
        kube.patch_pod_annotations(fleet.namespace, "llm-b", {REPORT: "{}"}, uid=pods["llm-b"].metadata.uid)
    assert info.value.status == 403, info.value
    why = _refused(kube.core, fleet.namespace, pods["llm-b"], {REPORT: "{}"})
    assert "may write only pods on its own node" in why, why


def test_any_other_change_by_the_agent_is_refused_even_on_its_own_node(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    core = client.CoreV1Api(fleet.client("agent", bound_pod=pods["agent-a"]))
    why = _refused(core, fleet.namespace, pods["llm-a"], {CAP: "700"})
    assert "may change only the annotation" in why, why
    why = _refused(core, fleet.namespace, pods["llm-a"], {REPORT: "{}"}, labels={"app": "moved"})
    assert "may not change a pod's spec, labels" in why, why


def test_a_token_bound_to_no_pod_carries_no_node_and_is_refused(world) -> None:  # type: ignore[no-untyped-def]
    fleet, pods = world
    why = _refused(client.CoreV1Api(fleet.client("agent")), fleet.namespace, pods["llm-a"], {REPORT: "{}"})
    assert "may write only pods on its own node" in why, why


def test_the_policy_does_not_apply_to_other_users(world) -> None:  # type: ignore[no-untyped-def]
    fleet, _ = world
    admin = admin_client(fleet.plane)
    try:
        patched = client.CoreV1Api(admin).patch_namespaced_pod("llm-b", fleet.namespace,
                                                               {"metadata": {"labels": {"x": "y"}}})
    finally:
        admin.close()
    assert patched.metadata.labels["x"] == "y", patched.metadata
