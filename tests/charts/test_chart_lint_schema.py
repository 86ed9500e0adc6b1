"""The chart lints clean under --strict, every rendered object passes the Kubernetes schema, and
values.schema.json refuses bad values with a message that names the key."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
import yaml

from tests.charts.chartlib import CHART_DIR, CRD_KINDS, HELM_SKIP_REASON, KUBE_VERSION, find, objects, one, render
from tests.charts.values_schema import SCHEMA_PATH, dumps, regenerated

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)

REPO = CHART_DIR.parents[1]


def test_lint_strict_is_clean(variant: tuple[str, dict[str, Any]]) -> None:
    name, values = variant
    report = helm.lint(CHART_DIR, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [], report
    # Severity 2 = warning, 3 = error; 1 (info, "icon is recommended") is allowed.
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [], f"{name}: {problems}"


def test_every_object_passes_the_strict_kubernetes_schema(variant: tuple[str, dict[str, Any]]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    name, values = variant
    objs = [o for o in objects(values) if o["kind"] not in CRD_KINDS]
    assert objs, "the chart rendered nothing"
    failures = []
    for obj in objs:
        ident = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kv.validate(obj, KUBE_VERSION, strict=True)
        except ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            failures.append(f"{ident}: {path}: {exc.message}")
        except SchemaNotFoundError as exc:
            failures.append(f"{ident}: {exc.message}")
    assert failures == [], f"{name}:\n" + "\n".join(failures)


def test_every_object_is_namespaced_to_the_release_or_cluster_scoped(variant: tuple[str, dict[str, Any]]) -> None:
    _, values = variant
    agent_namespaces = set(values.get("agent", {}).get("namespaces", []))
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for obj in objects(values):
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert ns is None, obj["metadata"]
            # Cluster-scoped names carry the namespace so two releases cannot collide.
            assert obj["metadata"]["name"].startswith("fleet-pf-"), obj["metadata"]["name"]
        elif obj["kind"] in ("Role", "RoleBinding") and ns != "fleet":
            # Agents read pods in agent.namespaces; workers reach DGDs where the budget names them.
            budget_ns = {k.split("/")[0] for k in values.get("config", {}).get("budget", {}).get("deployments", {})}
            allowed = {"pf-powerfleet-agent": agent_namespaces, "pf-powerfleet-worker": budget_ns}
            assert ns in allowed.get(obj["metadata"]["name"], set()), obj["metadata"]
        else:
            assert ns == "fleet", f"{obj['kind']}/{obj['metadata']['name']} has namespace {ns!r}"
        assert len(obj["metadata"]["name"]) <= 63


def test_notes_render() -> None:
    notes = render({})["powerfleet/templates/NOTES.txt"]
    assert "deployment/pf-powerfleet-beat" in notes


# -- values.schema.json --

def _refused(values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmValuesError) as info:
        objects(values)
    return str(info.value)


@pytest.mark.parametrize(("values", "messages"), [
    # wrong types
    ({"worker": {"replicas": "three"}}, ["at '/worker/replicas': got string, want integer"]),
    ({"agent": {"enabled": "yes"}}, ["at '/agent/enabled': got string, want boolean"]),
    ({"config": {"nodes": "gpu-a"}}, ["at '/config/nodes': got string, want array"]),
    # unknown keys, at the top and inside
    ({"wokrer": {"replicas": 2}}, ["at '': additional properties 'wokrer' not allowed"]),
    ({"worker": {"replica": 2}}, ["at '/worker': additional properties 'replica' not allowed"]),
    ({"config": {"beat": {"reconcile_interval": 5}}},
     ["at '/config/beat': additional properties 'reconcile_interval' not allowed"]),
    # watts and intervals must be above zero
    ({"agent": {"safeDefaultWatts": 0}}, ["at '/agent/safeDefaultWatts': minimum: got 0, want 1"]),
    ({"agent": {"safeDefaultWatts": -300}}, ["at '/agent/safeDefaultWatts': minimum: got -300, want 1"]),
    ({"config": {"budget": {"groups": {"rack-a": 0}}}},
     ["at '/config/budget/groups/rack-a': minimum: got 0, want 1"]),
    ({"config": {"budget": {"deployments": {"llm/a": {"power_limit_w": -1}}}}},
     ["at '/config/budget/deployments/llm~1a/power_limit_w': minimum: got -1, want 1"]),
    ({"config": {"beat": {"reconcile_interval_s": 0}}},
     ["at '/config/beat/reconcile_interval_s': exclusiveMinimum: got 0, want 0"]),
    ({"config": {"beat": {"budget_interval_s": -5}}},
     ["at '/config/beat/budget_interval_s': exclusiveMinimum: got -5, want 0"]),
    ({"worker": {"livenessProbe": {"periodSeconds": 0}}},
     ["at '/worker/livenessProbe/periodSeconds': minimum: got 0, want 1"]),
    # the agent needs time to restore every cap on shutdown
    ({"agent": {"terminationGracePeriodSeconds": 45}},
     ["at '/agent/terminationGracePeriodSeconds': 'anyOf' failed", "minimum: got 45, want 60"]),
    # Flower exposed without auth
    ({"flower": {"enabled": True}}, ["at '/flower/basicAuthSecret/name': minLength: got 0, want 1"]),
    # both broker sources, and neither
    ({"broker": {"existingSecret": {"name": "b"}}},
     ["at '': 'oneOf' failed, none matched", "at '/broker/existingSecret/name': maxLength: got 1, want 0",
      "at '/redis/enabled': value must be false"]),
    ({"redis": {"enabled": False}},
     ["at '': 'oneOf' failed, none matched", "at '/redis/enabled': value must be true",
      "at '/broker/existingSecret/name': minLength: got 0, want 1"]),
    # exactly one of image.tag and image.digest
    ({"image": {"digest": "sha256:" + "0" * 64}}, ["at '/image': 'oneOf' failed", "at '/image/tag': maxLength"]),
    ({"image": {"tag": ""}}, ["at '/image': 'oneOf' failed", "at '/image/tag': minLength: got 0, want 1"]),
    ({"image": {"tag": "", "digest": "sha256:abc"}}, ["at '/image/digest': 'sha256:abc' does not match"]),
    # Redis must be bounded, and a chosen password strong enough to sit in a checksum
    ({"redis": {"maxmemory": ""}}, ["at '/redis/maxmemory': '' does not match"]),
    ({"redis": {"auth": {"password": "short"}}}, ["at '/redis/auth/password': 'short' does not match"]),
    ({"agent": {"safeDefaultWatts": 450.5}}, ["at '/agent/safeDefaultWatts': got number, want integer"]),
    ({"worker": {"queues": []}}, ["at '/worker/queues': minItems: got 0, want 1"]),
    ({"worker": {"queues": ["contrl"]}}, ["at '/worker/queues/0': 'contrl' does not match"]),
])
def test_schema_refuses_bad_values_with_its_message(values: dict[str, Any], messages: list[str]) -> None:
    text = _refused(values)
    assert "values don't meet the specifications of the schema" in text
    for message in messages:
        assert message in text, f"{message!r} not in:\n{text}"


def test_the_defaults_and_their_boundaries_pass_the_schema() -> None:
    # Each boundary value renders, and lands where it is meant to (not merely "no error").
    agent = one(objects({"agent": {"terminationGracePeriodSeconds": 60, "safeDefaultWatts": 1}}), "DaemonSet", "agent")
    assert agent["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60, agent["spec"]["template"]["spec"]
    digest = "sha256:" + "0" * 64
    images = {c["image"] for o in objects({"image": {"tag": "", "digest": digest}}) for c in _containers(o)}
    ours = {i for i in images if "/powerfleet/" in i}  # (the bundled Redis keeps its own image)
    assert ours and all(i.endswith("@" + digest) for i in ours), images
    assert find(objects({"redis": {"auth": {"password": "a" * 16}}}), "StatefulSet", "redis")
    external = objects({"broker": {"existingSecret": {"name": "b"}}, "redis": {"enabled": False}})
    assert not find(external, "StatefulSet", "redis"), "redis.enabled=false still renders a Redis"
    assert one(external, "DaemonSet", "agent")
    assert len(objects({"global": {"imageRegistry": "x"}})) == len(objects())  # a parent chart's globals are tolerated


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec") or (
        spec if obj["kind"] == "Pod" else {})
    return list(pod.get("containers", [])) + list(pod.get("initContainers", []))


def test_config_schema_matches_the_fleet_config_model() -> None:
    """The `config` part is generated from FleetConfig; regenerate when the model changes."""
    current = json.loads(SCHEMA_PATH.read_text())
    assert dumps(regenerated(current)) == SCHEMA_PATH.read_text(), (
        "values.schema.json is out of date with FleetConfig: run .venv/bin/python -m tests.charts.values_schema")


def test_every_default_value_is_described_by_the_schema() -> None:
    """values.yaml keys all appear in the schema (additionalProperties would refuse the rest)."""
    schema = json.loads(SCHEMA_PATH.read_text())
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(defaults) <= set(schema["properties"]), set(defaults) - set(schema["properties"])


def test_image_tag_chart_app_version_and_package_version_agree() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert values["image"]["tag"] == chart["appVersion"] == project["version"]
    assert values["image"]["digest"] == ""
