"""The chart lints clean under --strict and every rendered object passes the Kubernetes schema."""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts.chartlib import CHART_DIR, HELM_SKIP_REASON, KUBE_VERSION, objects, render

helm = pytest.importorskip("helm_python", reason=HELM_SKIP_REASON)


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
    objs = objects(values)
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
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for obj in objects(values):
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert ns is None, obj["metadata"]
            # Cluster-scoped names carry the namespace so two releases cannot collide.
            assert obj["metadata"]["name"].startswith("fleet-pf-"), obj["metadata"]["name"]
        else:
            assert ns == "fleet", f"{obj['kind']}/{obj['metadata']['name']} has namespace {ns!r}"
        assert len(obj["metadata"]["name"]) <= 63


def test_notes_render() -> None:
    notes = render({})["powerfleet/templates/NOTES.txt"]
    assert "deployment/pf-powerfleet-beat" in notes
    assert "config.nodes is empty" in notes
