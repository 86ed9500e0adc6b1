"""RBAC: every verb granted is one the Kubernetes adapter calls for that role, and every call the
adapter makes for a role is granted; the shape of each Role (namespaced where it can be)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.charts.chartlib import HELM_SKIP_REASON, find, objects, one
from tests.charts.rbac_calls import SRC, Perm, references, scan_adapter

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)

# Which adapter methods (src/powerfleet/cluster) each feature's code calls. Checked against
# the code below: a method listed here must be called there, and vice versa.
ROLE_METHODS: dict[str, set[str]] = {
    "agent": {"list_pods", "list_pods_with_version", "watch_pods", "get_pod", "patch_pod_annotations"},
    "budget": {"get_dgd_object", "list_dgds", "patch_dgd_replicas", "patch_dgd_status", "list_pods",
               "record_event", "list_nodes", "read_status", "write_status", "set_condition", "list_gpu_pods",
               "list_scaling_adapters", "patch_adapter_replicas", "list_claim_templates",
               "list_gpu_pods_with_version", "watch_gpu_pods"},
    "retune": {"list_pods", "get_dgd_object", "record_event"},
    "leases": {"get_lease", "create_lease", "update_lease", "delete_lease"},
}
# Where each feature's code lives (under src/powerfleet).
ROLE_CODE: dict[str, list[str]] = {
    "agent": ["agent", "tasks/agent.py"],
    # The power guard (oversubscribed groups) reads what a group budget reads: the group's nodes
    # and the pods on them, under the worker's group-budget grant.
    # The ledger's watch-backed pod view (budget.pod_source: watch) lives with the adapter.
    "budget": ["budget", "tasks/budget.py", "power", "tasks/power.py", "cluster/gpu_pod_cache.py"],
    "retune": ["retune", "tasks/retune.py"],
    "leases": ["retune", "tasks/retune.py"],
}
# Adapter methods no fleet process calls, so no role is granted them (and none may call them).
NOT_CALLED_BY_THE_FLEET: dict[str, str] = {
    "list_events": "tests and the twin read recorded events back",
    "get_dgd": "tests; the fleet reads DGDs through get_dgd_object",
}

GROUPS = {"budget": {"groups": {"rack-a": 40000}, "deployments": {"llm-a/big": {"power_limit_w": 8000},
                                                                  "fleet/small": {"power_limit_w": 2000}}}}
ALL_ON = {"retune": {"enabled": True}, "budget": {"enabled": True}, "config": GROUPS}
ROLE_KINDS = ("Role", "ClusterRole")


@pytest.fixture(scope="module")
def adapter():  # type: ignore[no-untyped-def]
    return scan_adapter()


def _granted(role: dict[str, Any]) -> set[Perm]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def _needed(adapter: Any, *roles: str) -> set[Perm]:
    return set().union(*(adapter.perms_of(m) for role in roles for m in ROLE_METHODS[role]))


def test_every_client_call_in_the_adapter_is_mapped(adapter: Any) -> None:
    assert adapter.unknown == [], "add these to CLIENT_CALLS in tests/charts/rbac_calls.py"
    assert adapter.uses, "found no client call in src/powerfleet/cluster"


def test_every_api_method_of_the_adapter_is_claimed_by_a_role_or_unused(adapter: Any) -> None:
    claimed = set().union(*ROLE_METHODS.values()) | set(NOT_CALLED_BY_THE_FLEET)
    assert adapter.api_methods() - claimed == set(), "an adapter call no role is granted"
    assert claimed - adapter.api_methods() == set(), "a claimed method the adapter no longer has"


@pytest.mark.parametrize("role", sorted(ROLE_METHODS))
def test_role_methods_match_what_the_role_code_calls(adapter: Any, role: str) -> None:
    code = [SRC / p for p in ROLE_CODE[role]]
    called = set(references(code, adapter.api_methods()))
    if not called:
        pytest.xfail(f"{role}: its code ({ROLE_CODE[role]}) calls no adapter method yet; grants follow ROLE_METHODS")
    # `leases` and `retune` share their code; each claims its own part of what it calls.
    sharing = [r for r in ROLE_METHODS if r != role and ROLE_CODE[r] == ROLE_CODE[role]]
    others = set().union(*(ROLE_METHODS[r] for r in sharing)) if sharing else set()
    assert ROLE_METHODS[role] - called == set(), f"{role}: declared but not called in {ROLE_CODE[role]}"
    assert called - ROLE_METHODS[role] - others == set(), f"{role}: called but not declared in ROLE_METHODS"


def test_only_the_role_code_calls_the_adapter(adapter: Any) -> None:
    """A call from anywhere else (a new task module, the CLI) would run under no known grant."""
    role_paths = {SRC / p for paths in ROLE_CODE.values() for p in paths}
    others: list[Path] = []
    for top in SRC.iterdir():
        # testing/ is the tests' and benches' harness (it reads as the test's admin, and nothing in
        # the fleet imports it: tests/unit/test_import_graph.py), so it runs under no fleet grant.
        if top.name in ("cluster", "twin", "testing") or top in role_paths:
            continue
        if top.is_dir() and any(p.is_relative_to(top) for p in role_paths):
            others.extend(p for p in top.iterdir() if p not in role_paths)
        else:
            others.append(top)
    assert references(others, adapter.api_methods()) == {}, "add the caller to ROLE_CODE and ROLE_METHODS"


def test_nothing_in_the_fleet_calls_the_unclaimed_methods() -> None:
    fleet = [p for p in SRC.iterdir() if p.name not in ("cluster", "twin")]
    assert references(fleet, set(NOT_CALLED_BY_THE_FLEET)) == {}


CLUSTER_SCOPED = {"nodes"}
GROUP_PERMS = {("", "nodes", "list"), ("nvidia.com", "dynamographdeployments", "list"), ("", "pods", "list")}


def _bound_to(objs: list[dict[str, Any]], sa: str) -> list[dict[str, Any]]:
    """The Roles and ClusterRoles bound to ServiceAccount ``sa``."""
    refs = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
            for b in objs if b["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(s["name"] == sa for s in b["subjects"])}
    return [r for r in objs if r["kind"] in ROLE_KINDS and (r["kind"], r["metadata"]["name"],
                                                            r["metadata"].get("namespace")) in refs]


POD_WATCH = ("", "pods", "watch")  # only for budget.pod_source "watch" (the ledger's watch-backed view)


@pytest.mark.parametrize("pod_source", ["list", "watch"])
@pytest.mark.parametrize("watch_all", [False, True])
def test_worker_grants_exactly_what_budget_and_retune_call(adapter: Any, watch_all: bool, pod_source: str) -> None:
    config = {**GROUPS, "budget": {**GROUPS["budget"], "pod_source": pod_source}}
    objs = objects({**ALL_ON, "config": config, "rbac": {"watchAllNamespaces": watch_all}})
    roles = _bound_to(objs, "pf-powerfleet-worker")
    needed = _needed(adapter, "budget", "retune", "leases")
    assert POD_WATCH in needed
    assert set().union(*(_granted(r) for r in roles)) == (needed if pod_source == "watch" else needed - {POD_WATCH})
    for role in roles:
        perms = _granted(role)
        if any(r == "leases" for _, r, _ in perms):
            # Leases stay in a Role in the release namespace even in cluster-wide mode.
            assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "fleet")
            assert perms == _needed(adapter, "leases")
        elif role["kind"] == "Role":
            assert not watch_all
            assert not any(r in CLUSTER_SCOPED for _, r, _ in perms)
        elif not watch_all:
            # Group budgets read nodes, DGDs and pods cluster-wide; nothing else is cluster-wide.
            assert perms == (GROUP_PERMS | {POD_WATCH} if pod_source == "watch" else GROUP_PERMS)
    if not watch_all:
        # A Role in the release namespace and in each namespace the budget names, none elsewhere.
        namespaced = {r["metadata"]["namespace"] for r in roles if r["kind"] == "Role"}
        assert namespaced == {"fleet", "llm-a"}


def test_retune_leases_namespace_is_the_release_namespace() -> None:
    import yaml

    fleet = yaml.safe_load(one(objects(ALL_ON), "ConfigMap", "config")["data"]["fleet.yaml"])
    assert fleet["retune"]["namespace"] == "fleet"
    with pytest.raises(helm.HelmRenderError, match="config.retune.namespace .other. holds the retune Leases"):
        objects({**ALL_ON, "config": {"retune": {"namespace": "other"}}})


# The agent's calls without the enforcement report annotation (agent.enforcementReport.enabled=false).
AGENT_REPORT_METHODS = {"get_pod", "patch_pod_annotations"}


def test_agent_grants_exactly_what_the_agent_calls(adapter: Any) -> None:
    objs = objects({})
    assert _granted(one(objs, "ClusterRole", "agent")) == _needed(adapter, "agent")
    assert ("", "pods", "patch") in _needed(adapter, "agent")  # the report, guarded by agent-admission.yaml
    restricted = objects({"agent": {"namespaces": ["llm-a", "llm-b"]}})
    assert not find(restricted, "ClusterRole", "agent") and not find(restricted, "ClusterRoleBinding", "agent")
    roles = find(restricted, "Role", "agent")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["llm-a", "llm-b"]
    for role in roles:
        assert _granted(role) == _needed(adapter, "agent")
    for binding in find(restricted, "RoleBinding", "agent"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pf-powerfleet-agent", "namespace": "fleet"}]


def test_without_the_report_the_agent_may_only_read_pods(adapter: Any) -> None:
    objs = objects({"agent": {"enforcementReport": {"enabled": False}}})
    read_only = set().union(*(adapter.perms_of(m) for m in ROLE_METHODS["agent"] - AGENT_REPORT_METHODS))
    assert _granted(one(objs, "ClusterRole", "agent")) == read_only == {("", "pods", "list"), ("", "pods", "watch")}
    assert not find(objs, "ValidatingAdmissionPolicy") and not find(objs, "ValidatingAdmissionPolicyBinding")


def test_everything_granted_is_called_and_everything_called_is_granted(adapter: Any) -> None:
    """The union over all roles with every feature on equals the adapter's calls."""
    objs = objects(ALL_ON)
    granted = set().union(*(_granted(r) for r in objs if r["kind"] in ROLE_KINDS))
    called = set().union(*(adapter.perms_of(m) for m in adapter.api_methods() - set(NOT_CALLED_BY_THE_FLEET)))
    assert granted - called == set(), "granted but never called"
    assert called - granted == set(), "called but never granted"


@pytest.mark.parametrize(("values", "has_main", "has_leases", "token"), [
    ({"budget": {"enabled": False}}, False, False, False),
    ({"budget": {"enabled": False}, "retune": {"enabled": True}}, True, True, True),
    ({"retune": {"enabled": False}}, True, False, True),
    ({"retune": {"enabled": True}}, True, True, True),
    ({**ALL_ON, "config": {}, "worker": {"queues": ["sweep"]}}, False, False, False),  # shards call no API
])
def test_worker_access_follows_the_features(values: dict[str, Any], has_main: bool, has_leases: bool,
                                            token: bool) -> None:
    objs = objects(values)
    roles = find(objs, "Role", "worker")
    assert any(not r["metadata"]["name"].endswith("-leases") for r in roles) is has_main
    assert any(r["metadata"]["name"].endswith("-leases") for r in roles) is has_leases
    assert len(find(objs, "RoleBinding", "worker")) == len(roles)
    assert not find(objs, "ClusterRole", "worker"), "no group budgets: nothing cluster-wide"
    deploy = one(objs, "Deployment", "worker")
    assert deploy["spec"]["template"]["spec"]["automountServiceAccountToken"] is token
    assert one(objs, "ServiceAccount", "worker")["automountServiceAccountToken"] is token


def test_no_rbac_rule_uses_a_wildcard_or_reads_secrets(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    forbidden_resources = {"secrets", "serviceaccounts/token", "roles", "clusterroles", "rolebindings",
                           "clusterrolebindings", "pods/exec", "nodes/proxy"}
    forbidden_verbs = {"escalate", "bind", "impersonate", "deletecollection"}
    roles = [o for o in objects(values) if o["kind"] in ROLE_KINDS]
    for role in roles:
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule
            assert not forbidden_resources & set(rule["resources"]), (role["metadata"]["name"], rule)
            assert not forbidden_verbs & set(rule["verbs"]), (role["metadata"]["name"], rule)


def test_only_worker_and_agent_service_accounts_are_bound() -> None:
    objs = objects({**ALL_ON, "flower": {"enabled": True, "basicAuthSecret": {"name": "a"}},
                    "rbac": {"watchAllNamespaces": True}})
    subjects = {s["name"] for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o["subjects"]}
    assert subjects == {"pf-powerfleet-worker", "pf-powerfleet-agent"}


def test_bindings_follow_an_existing_service_account_name() -> None:
    objs = objects({"worker": {"serviceAccount": {"create": False, "name": "ops-worker"}},
                    "agent": {"serviceAccount": {"create": True, "name": "gpu-agent"}}})
    assert not find(objs, "ServiceAccount", "worker")
    assert one(objs, "ServiceAccount", "agent")["metadata"]["name"] == "gpu-agent"
    assert one(objs, "RoleBinding", "worker")["subjects"][0]["name"] == "ops-worker"
    assert one(objs, "ClusterRoleBinding", "agent")["subjects"][0]["name"] == "gpu-agent"
    assert one(objs, "Deployment", "worker")["spec"]["template"]["spec"]["serviceAccountName"] == "ops-worker"


def test_rbac_create_false_renders_no_rbac() -> None:
    objs = objects({**ALL_ON, "rbac": {"create": False}})
    assert not [o for o in objs if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
