"""RBAC least privilege, token mounts, privilege, and secrets kept out of ConfigMaps and argv."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.charts.chartlib import HELM_SKIP_REASON, env_of, find, objects, one, pod_spec, workloads

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)

ROLE_KINDS = ("Role", "ClusterRole")

WORKER_RULES = [
    (("nvidia.com",), ("dynamographdeployments",), ("get", "list", "watch", "update", "patch")),
    (("nvidia.com",), ("dynamographdeployments/status",), ("get", "update", "patch")),
    (("",), ("pods",), ("get", "list", "watch")),
    (("coordination.k8s.io",), ("leases",), ("get", "list", "watch", "create", "update", "delete")),
    (("",), ("events",), ("create", "patch")),
    (("events.k8s.io",), ("events",), ("create",)),
]
AGENT_RULES = [
    (("",), ("pods",), ("get", "list", "watch")),
    (("",), ("events",), ("create", "patch")),
]


def _rules(role: dict[str, Any]) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    return [(tuple(r.get("apiGroups", [])), tuple(r.get("resources", [])), tuple(r.get("verbs", [])))
            for r in role["rules"]]


def test_no_rbac_rule_uses_a_wildcard(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    roles = [o for o in objects(values) if o["kind"] in ROLE_KINDS]
    assert roles
    for role in roles:
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule


def test_no_role_can_read_secrets_or_escalate(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    forbidden_resources = {"secrets", "serviceaccounts/token", "roles", "clusterroles", "rolebindings",
                           "clusterrolebindings", "pods/exec", "nodes/proxy"}
    forbidden_verbs = {"escalate", "bind", "impersonate", "deletecollection"}
    for role in (o for o in objects(values) if o["kind"] in ROLE_KINDS):
        for rule in role["rules"]:
            assert not forbidden_resources & set(rule["resources"]), (role["metadata"]["name"], rule)
            assert not forbidden_verbs & set(rule["verbs"]), (role["metadata"]["name"], rule)


def test_worker_gets_a_namespaced_role_with_exactly_its_rules() -> None:
    objs = objects({})
    role = one(objs, "Role", "worker")
    assert role["metadata"]["namespace"] == "fleet"
    assert _rules(role) == WORKER_RULES
    assert not find(objs, "ClusterRole", "worker")
    binding = one(objs, "RoleBinding", "worker")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pf-powerfleet-worker", "namespace": "fleet"}]


def test_watch_all_namespaces_gives_the_worker_a_cluster_role_with_the_same_rules() -> None:
    objs = objects({"rbac": {"watchAllNamespaces": True}})
    role = one(objs, "ClusterRole", "worker")
    assert _rules(role) == WORKER_RULES
    assert not find(objs, "Role", "worker")
    binding = one(objs, "ClusterRoleBinding", "worker")
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["subjects"][0]["name"] == "pf-powerfleet-worker"


def test_agent_cluster_role_lists_pods_and_writes_events_only(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    if not find(objs, "DaemonSet", "agent"):
        assert not find(objs, "ClusterRole", "agent")
        return
    assert _rules(one(objs, "ClusterRole", "agent")) == AGENT_RULES
    binding = one(objs, "ClusterRoleBinding", "agent")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pf-powerfleet-agent", "namespace": "fleet"}]


def test_only_worker_and_agent_service_accounts_are_bound() -> None:
    objs = objects({"flower": {"enabled": True, "basicAuthSecret": {"name": "a"}}, "rbac": {"watchAllNamespaces": True}})
    subjects = {s["name"] for o in objs if o["kind"].endswith("Binding") for s in o["subjects"]}
    assert subjects == {"pf-powerfleet-worker", "pf-powerfleet-agent"}


def test_rbac_create_false_renders_no_rbac() -> None:
    objs = objects({"rbac": {"create": False}})
    assert not [o for o in objs if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]


def test_one_service_account_per_role_and_tokens_only_where_needed(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    needs_api = {"worker": True, "agent": True, "beat": False, "flower": False, "redis": False}
    for workload in workloads(objs):
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = pod_spec(workload)
        sa = one(objs, "ServiceAccount", component)
        assert spec["serviceAccountName"] == sa["metadata"]["name"] == f"pf-powerfleet-{component}"
        assert sa["automountServiceAccountToken"] is needs_api[component], component
        assert spec["automountServiceAccountToken"] is needs_api[component], component
    sa_names = [o["metadata"]["name"] for o in find(objs, "ServiceAccount")]
    assert len(sa_names) == len(set(sa_names)) == len(workloads(objs))


def test_only_the_agent_container_is_privileged(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    for workload in workloads(objects(values)):
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = pod_spec(workload)
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c.get("securityContext", {})
            if component == "agent":
                assert sc.get("privileged") is True
                continue
            assert not sc.get("privileged"), component
            assert sc.get("allowPrivilegeEscalation") is False, component
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], component
            assert spec["securityContext"].get("runAsNonRoot") is True, component
        if component != "agent":
            assert not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("hostIPC")


def _configmap_text(objs: list[dict[str, Any]]) -> str:
    return "\n".join(v for cm in find(objs, "ConfigMap") for v in cm.get("data", {}).values())


def test_broker_url_never_in_a_configmap(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    text = _configmap_text(objs)
    assert text
    for needle in ("redis://", "rediss://", "unix://", "broker", "basic_auth", "password", "REDIS_PASSWORD"):
        assert needle not in text, needle
    for secret in find(objs, "Secret"):
        for raw in secret.get("data", {}).values():
            assert base64.b64decode(raw).decode() not in text


def test_secret_config_keys_fail_rendering() -> None:
    for values, match in [
        ({"config": {"broker": {"url": "redis://:pw@redis:6379/0"}}}, "config.broker.url"),
        ({"config": {"broker": {"result_backend": "redis://:pw@redis:6379/1"}}}, "config.broker.url"),
        ({"config": {"flower": {"basic_auth": ["ops:pw"]}}}, "config.flower.basic_auth"),
        ({"config": {"metrics": {"port": 9000}}}, "config.metrics"),
    ]:
        with pytest.raises(helm.HelmRenderError, match=match.replace(".", r"\.")):
            objects(values)


def test_broker_url_reaches_every_process_from_a_secret(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    external = bool(values.get("broker", {}).get("existingSecret", {}).get("name"))
    for workload in workloads(objs):
        if workload["metadata"]["labels"]["app.kubernetes.io/component"] == "redis":
            continue
        (c,) = pod_spec(workload)["containers"]
        env = env_of(c)
        assert env["POWERFLEET_CONFIG"]["value"] == "/etc/powerfleet/powerfleet.yaml"
        url = env["POWERFLEET_BROKER__URL"]
        if external:
            assert url["valueFrom"]["secretKeyRef"] == {"name": "fleet-broker", "key": "url"}
            assert env["POWERFLEET_BROKER__RESULT_BACKEND"]["valueFrom"]["secretKeyRef"]["key"] == "results"
        else:
            assert url["value"] == "redis://:$(REDIS_PASSWORD)@pf-powerfleet-redis.fleet.svc:6379/0"
            # Defined before use, or Kubernetes leaves $(REDIS_PASSWORD) unexpanded.
            names = [e["name"] for e in c["env"]]
            assert names.index("REDIS_PASSWORD") < names.index("POWERFLEET_BROKER__URL")
            assert "secretKeyRef" in env["REDIS_PASSWORD"]["valueFrom"]


def test_no_secret_value_appears_outside_secrets(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    secret_values = [base64.b64decode(v).decode() for s in find(objs, "Secret") for v in s.get("data", {}).values()]
    others = repr([o for o in objs if o["kind"] != "Secret"])
    for value in secret_values:
        assert value not in others


def test_in_chart_redis_password_is_generated_url_safe_and_kept_off_argv() -> None:
    objs = objects({})
    secret = one(objs, "Secret", "redis")
    password = base64.b64decode(secret["data"]["redis-password"]).decode()
    assert len(password) == 32 and password.isalnum()
    sts = one(objs, "StatefulSet", "redis")
    (c,) = pod_spec(sts)["containers"]
    script = " ".join(c["command"] + c["args"])
    assert "--maxmemory-policy noeviction" in script
    assert "requirepass" in script and password not in script
    assert env_of(c)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "pf-powerfleet-redis",
                                                                         "key": "redis-password"}


def test_redis_existing_secret_and_bad_password() -> None:
    objs = objects({"redis": {"auth": {"existingSecret": "my-redis", "existingSecretKey": "pw"}}})
    assert not find(objs, "Secret")
    worker = one(objs, "Deployment", "worker")
    ref = env_of(pod_spec(worker)["containers"][0])["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "my-redis", "key": "pw"}
    with pytest.raises(helm.HelmRenderError, match="URL-safe"):
        objects({"redis": {"auth": {"password": "p@ss/word"}}})


def test_broker_source_must_be_exactly_one() -> None:
    with pytest.raises(helm.HelmRenderError, match="not both"):
        objects({"broker": {"existingSecret": {"name": "b"}}})
    with pytest.raises(helm.HelmRenderError, match="no broker"):
        objects({"redis": {"enabled": False}})


def test_flower_enabled_without_auth_secret_fails_with_a_clear_message() -> None:
    with pytest.raises(helm.HelmRenderError) as info:
        objects({"flower": {"enabled": True}})
    message = str(info.value)
    assert "flower.enabled=true requires flower.basicAuthSecret.name" in message
    assert "basic auth is required" in message


def test_flower_gets_basic_auth_from_its_secret_and_no_token() -> None:
    objs = objects({"flower": {"enabled": True, "basicAuthSecret": {"name": "fa", "key": "auth"}}})
    deploy = one(objs, "Deployment", "flower")
    (c,) = pod_spec(deploy)["containers"]
    assert c["args"] == ["flower", "--address", "0.0.0.0", "--port", "5555"]
    assert env_of(c)["POWERFLEET_FLOWER__BASIC_AUTH"]["valueFrom"]["secretKeyRef"] == {"name": "fa", "key": "auth"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthcheck"
    svc = one(objs, "Service", "flower")
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
