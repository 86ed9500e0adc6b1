"""The chart's RBAC enforced by the real authorizer: each component's ServiceAccount token may make
every call its code makes (tests/charts/rbac_calls.py reads them from the adapter) and nothing the
component must not do, as SelfSubjectAccessReview answers; the budget worker's adapter calls run
under its token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.kube import KubeCluster
from tests.charts.rbac_calls import scan_adapter
from tests.charts.test_chart_rbac import ROLE_METHODS
from tests.control_plane.cluster import admin_client
from tests.control_plane.fleet import FleetRbac, allowed
from tests.control_plane.servers import GROUP, PLURAL

# Feature (ROLE_METHODS) -> the ServiceAccount its code runs under.
RUNS_AS = {"agent": "agent", "budget": "worker", "retune": "worker", "leases": "worker"}
# What each component must never be able to do: (verb, group, resource, namespace or None = the release's).
MUST_NOT: dict[str, list[tuple[str, str, str]]] = {
    "agent": [("delete", "", "pods"), ("create", "", "pods"), ("update", "", "pods/status"), ("get", "", "secrets"),
              ("patch", GROUP, PLURAL), ("list", "", "nodes"), ("create", "", "pods/eviction")],
    "worker": [("delete", GROUP, PLURAL), ("create", GROUP, PLURAL), ("update", GROUP, PLURAL),
               ("get", "", "secrets"), ("create", "", "pods"), ("delete", "", "pods"), ("patch", "", "nodes"),
               ("patch", "", "pods"), ("delete", "", "configmaps"), ("watch", GROUP, PLURAL)],
    "beat": [("list", "", "pods"), ("get", GROUP, PLURAL), ("get", "", "configmaps"), ("get", "", "secrets")],
    "redis": [("list", "", "pods"), ("get", "", "secrets")],
    "agent-drain": [("list", "", "pods"), ("patch", "", "pods"), ("get", "", "secrets")],
}
CLUSTER_SCOPED = {"nodes"}


@pytest.fixture(scope="module")
def fleet(control_plane, tmp_path_factory) -> Iterator[FleetRbac]:  # type: ignore[no-untyped-def]
    rbac = FleetRbac.install(control_plane, tmp_path_factory.mktemp("rbac"))
    yield rbac
    rbac.close()


@pytest.fixture(scope="module")
def adapter():  # type: ignore[no-untyped-def]
    return scan_adapter()


@pytest.mark.parametrize("feature", sorted(RUNS_AS))
def test_each_token_may_make_every_call_its_code_makes(fleet: FleetRbac, adapter, feature: str) -> None:
    api = fleet.client(RUNS_AS[feature])
    needed = set().union(*(adapter.perms_of(m) for m in ROLE_METHODS[feature]))
    denied = sorted(p for p in needed
                    if not allowed(api, p[2], p[0], p[1], None if p[1] in CLUSTER_SCOPED else fleet.namespace))
    assert needed and denied == [], f"{feature} ({RUNS_AS[feature]}) is refused {denied} by the real server"


@pytest.mark.parametrize("component", sorted(MUST_NOT))
def test_no_token_may_do_what_its_component_must_not(fleet: FleetRbac, component: str) -> None:
    api = fleet.client(component)
    granted = [(v, g, r) for v, g, r in MUST_NOT[component]
               if allowed(api, v, g, r, None if r in CLUSTER_SCOPED else fleet.namespace)]
    assert granted == [], f"{component} may {granted} on the real server"


def test_the_agent_may_not_read_pods_outside_the_cluster_role_nor_write_other_kinds(fleet: FleetRbac) -> None:
    api = fleet.client("agent")
    assert allowed(api, "list", "", "pods", "some-other-namespace"), "the agent lists its node's pods everywhere"
    assert not allowed(api, "patch", "", "configmaps", fleet.namespace)
    assert not allowed(api, "create", "", "events", fleet.namespace)


def test_the_budget_workers_token_runs_the_adapters_calls_and_a_delete_is_403(fleet: FleetRbac) -> None:
    admin = admin_client(fleet.plane)
    ns = fleet.namespace
    try:
        client.CustomObjectsApi(admin).create_namespaced_custom_object(GROUP, "v1alpha1", ns, PLURAL, {
            "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": "llm"},
            "spec": {"services": {"decode": {"componentType": "worker", "replicas": 1}}}})
    finally:
        admin.close()
    kube = KubeCluster(fleet.client("worker"))
    assert kube.dgd_version() == "v1alpha1"  # the only version served (docs/twin.md, "Real control plane")
    assert [d.name for d in kube.list_dgds(ns)] == ["llm"]
    scaled = kube.patch_dgd_replicas(ns, "llm", {"decode": 2})
    assert {c.name: c.replicas for c in scaled.components} == {"decode": 2}, scaled
    written = kube.patch_dgd_status(ns, "llm", {"observedGeneration": 1})
    assert isinstance(written, dict) and written["status"]["observedGeneration"] == 1, written
    assert kube.list_pods(ns) == []
    kube.list_nodes()  # the group grant (cluster-wide): a 403 would raise
    with pytest.raises(ApiException) as info:
        kube.custom.delete_namespaced_custom_object(GROUP, "v1alpha1", ns, PLURAL, "llm")
    assert info.value.status == 403, info.value.body
