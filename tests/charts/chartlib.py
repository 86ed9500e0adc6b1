"""Offline rendering of charts/powerfleet with helm-python-sdk (Helm's Go SDK through ctypes).

The test modules call ``pytest.importorskip("helm_python")`` first and then use these helpers;
helm_python is imported lazily here so that collecting this file never needs it.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import yaml

HELM_SKIP_REASON = "helm-python-sdk is not installed (pip install 'helm-python-sdk==0.2.2')"

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "powerfleet"
RELEASE = "pf"
NAMESPACE = "fleet"
# The Kubernetes version the rendered objects are schema-checked against (kubernetes-validate).
KUBE_VERSION = "1.32.0"

# Value sets every structural test runs against.
VARIANTS: dict[str, dict[str, Any]] = {
    # In-chart Redis, beat, workers (budget on), agents, metrics; Flower, retune, monitoring off.
    "default": {},
    # Everything on: external broker, Flower with auth, retune with a trace volume, budget with a
    # deployment in another namespace and rack budgets, a sweep-only worker pool, namespace-restricted agents,
    # ServiceMonitor and dashboard, an image digest.
    "external": {
        "image": {"tag": "", "digest": "sha256:" + "ab" * 32},
        "broker": {"existingSecret": {"name": "fleet-broker", "key": "url", "resultBackendKey": "results"}},
        "redis": {"enabled": False},
        "flower": {"enabled": True, "basicAuthSecret": {"name": "fleet-flower-auth"},
                   "networkPolicy": {"extraFrom": [{"namespaceSelector": {"matchLabels": {"name": "ingress"}}}]}},
        "metrics": {"port": 9100, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                    "prometheusRule": {"enabled": True, "labels": {"release": "prom"}}, "dashboard": {"enabled": True}},
        "retune": {"enabled": True, "traceVolume": {"persistentVolumeClaim": {"claimName": "traces"}}},
        "imagePullSecrets": [{"name": "regcred"}],
        "config": {
            "nodes": ["gpu-node-a", "gpu-node-b"],
            "limits": {"sweep": {"soft_s": 1100, "hard_s": 1200.5}},
            "beat": {"reconcile_interval_s": 10},
            "budget": {"deployments": {"llm-a/llama": {"power_limit_w": 24000}}, "groups": {"rack-a": 60000}},
        },
        "worker": {"replicas": 3, "concurrency": 2, "queues": ["control"], "resources": {"limits": {"memory": "2Gi"}}},
        "sweepWorker": {"enabled": True, "replicas": 4, "concurrency": 8},
        "agent": {"namespaces": ["llm-a", "llm-b"], "safeDefaultWatts": 450,
                  "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]},
    },
    # Sweep-only workers (no API), no agents, no budget, no metrics, no NetworkPolicy, existing
    # ServiceAccount for beat, persistent Redis with the password from an existing Secret.
    "sweep-only": {
        "worker": {"queues": ["sweep"]},
        "agent": {"enabled": False},
        "budget": {"enabled": False},
        "metrics": {"port": 0},
        "networkPolicy": {"enabled": False},
        "beat": {"serviceAccount": {"create": False, "name": "fleet-beat"}},
        "redis": {"auth": {"existingSecret": "my-redis", "existingSecretKey": "pw"},
                  "persistence": {"enabled": True, "storageClass": "fast"}, "maxmemory": "2gb",
                  "resources": {"requests": {"cpu": "500m", "memory": "3Gi"}, "limits": {"cpu": "2", "memory": "3Gi"}}},
    },
    # The in-chart Redis replicated: three pods (Redis + Sentinel each), persistent.
    "sentinel": {"redis": {"mode": "sentinel", "persistence": {"enabled": True}}},
}

# Kinds from CRDs: kubernetes-validate has no schema for them (checked by their own tests).
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


@functools.lru_cache(maxsize=1)
def _chart() -> Any:
    # Loaded once per test process: the chart's files do not change while the tests run.
    import helm_python as helm

    return helm.Chart.load(CHART_DIR)


@functools.lru_cache(maxsize=128)
def _render_cached(values_json: str) -> tuple[tuple[str, str], ...]:
    out = _chart().render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)
    return tuple(sorted(out.items()))


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included). Raises helm_python.HelmRenderError."""
    return dict(_render_cached(json.dumps(values or {}, sort_keys=True)))


# libyaml when present: parsing the rendered YAML is most of these tests' time.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=128)
def _objects_cached(values_json: str) -> tuple[dict[str, Any], ...]:
    docs: list[dict[str, Any]] = []
    for path, text in _render_cached(values_json):
        if path.endswith((".yaml", ".yml")):
            docs.extend(d for d in yaml.load_all(text, Loader=_Loader) if d)
    return tuple(docs)


def objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (a fresh deep copy each call)."""
    return copy.deepcopy(list(_objects_cached(json.dumps(values or {}, sort_keys=True))))


def find(objs: list[dict[str, Any]], kind: str, component: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (
        component is None or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component)]


def one(objs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    found = find(objs, kind, component)
    assert len(found) == 1, f"expected one {kind} for {component}, got {len(found)}"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


def component_of(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def annotations_of(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"].get("annotations") or {}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}
