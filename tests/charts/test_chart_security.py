"""Token mounts, privilege, and secrets kept out of ConfigMaps and argv (RBAC: test_chart_rbac.py)."""

from __future__ import annotations

import base64
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.charts.chartlib import CHART_DIR, HELM_SKIP_REASON, component_of, env_of, find, objects, one, pod_spec, workloads

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)

def test_one_service_account_per_role_and_tokens_only_where_needed(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    worker_api = "control" in values.get("worker", {}).get("queues", ["control"]) and (
        values.get("budget", {}).get("enabled", True) or values.get("retune", {}).get("enabled", False))
    needs_api = {"worker": worker_api, "sweep-worker": False, "agent": True, "beat": False, "flower": False,
                 "redis": False}
    for workload in workloads(objs):
        component = component_of(workload)
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is needs_api[component], component
        sa_values = values.get(component, {}).get("serviceAccount", {})
        if sa_values.get("create", True) is False:
            assert spec["serviceAccountName"] == sa_values.get("name", "default")
            assert not find(objs, "ServiceAccount", component)
            continue
        sa = one(objs, "ServiceAccount", component)
        assert spec["serviceAccountName"] == sa["metadata"]["name"] == f"pf-powerfleet-{component}"
        assert sa["automountServiceAccountToken"] is needs_api[component], component
    sa_names = [o["metadata"]["name"] for o in find(objs, "ServiceAccount")]
    assert len(sa_names) == len(set(sa_names))


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
    return "\n".join(v for cm in find(objs, "ConfigMap", "config") for v in cm.get("data", {}).values())


def test_broker_url_never_in_a_configmap(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    objs = objects(values)
    text = _configmap_text(objs)
    assert text
    for needle in ("redis://", "rediss://", "unix://", "broker", "basic_auth", "password", "REDIS_PASSWORD",
                   "kubeconfig"):
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
        ({"config": {"agent": {"safe_default_watts": 300}}}, "config.agent.safe_default_watts must not be set: use agent.safeDefaultWatts"),
        ({"config": {"agent": {"state_dir": "/x"}}}, "config.agent.state_dir"),
        ({"config": {"agent": {"probe_port": 9000}}}, "config.agent.probe_port"),
        ({"budget": {"enabled": False}, "config": {"budget": {"deployments": {"ns/x": {"power_limit_w": 900}}}}},
         "budget.enabled=false grants the workers no access"),
        ({"config": {"retune": {"deployments": ["llama"]}}}, "retune.enabled=false grants the workers no Leases"),
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
        elif values.get("redis", {}).get("mode") == "sentinel":  # every Sentinel, the password from the Secret
            assert url["value"] == ";".join(f"sentinel://{':$(REDIS_PASSWORD)@' if i == 0 else ''}pf-powerfleet-redis-{i}"
                                            ".pf-powerfleet-redis-headless.fleet.svc:26379/0" for i in range(3))
            assert env["POWERFLEET_BROKER__SENTINEL__PASSWORD"]["value"] == "'$(REDIS_PASSWORD)'"
        else:
            assert url["value"] == "redis://:$(REDIS_PASSWORD)@pf-powerfleet-redis.fleet.svc:6379/0"
        if not external:
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


def test_redis_existing_secret() -> None:
    objs = objects({"redis": {"auth": {"existingSecret": "my-redis", "existingSecretKey": "pw"}}})
    assert not find(objs, "Secret")
    worker = one(objs, "Deployment", "worker")
    ref = env_of(pod_spec(worker)["containers"][0])["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "my-redis", "key": "pw"}


@pytest.mark.parametrize(("values", "message"), [
    ({"broker": {"existingSecret": {"name": "b"}}}, "not both"),
    ({"redis": {"enabled": False}}, "no broker: set broker.existingSecret.name"),
    ({"flower": {"enabled": True}}, "flower.enabled=true requires flower.basicAuthSecret.name"),
    ({"redis": {"auth": {"password": "p@ss/word-long-enough"}}}, "URL-safe"),
])
def test_templates_refuse_what_the_schema_refuses(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    """With `helm install --skip-schema-validation` the templates still fail, with their own message."""
    chart = tmp_path / "powerfleet"
    shutil.copytree(CHART_DIR, chart, ignore=shutil.ignore_patterns("values.schema.json"))
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        with helm.Chart.load(chart) as c:
            c.render(values, name="pf", namespace="fleet")


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
