"""Builders for DGD and pod objects as the API returns them."""

from __future__ import annotations

import copy
from typing import Any

from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION


def component(
    name: str,
    ctype: str,
    *,
    cap: str | None = None,
    gpus: Any = 1,
    via: str = "limits",
    replicas: int = 1,
    node_count: int | None = None,
) -> dict[str, Any]:
    resources = {} if gpus is None else {via: {"nvidia.com/gpu": gpus}}
    comp: dict[str, Any] = {
        "name": name,
        "type": ctype,
        "replicas": replicas,
        "podTemplate": {
            "metadata": {"annotations": {} if cap is None else {POWER_ANNOTATION: cap}, "labels": {"team": "llm"}},
            "spec": {"containers": [{"name": "sidecar", "image": "s"}, {"name": "main", "image": "m", "resources": resources}]},
        },
    }
    if node_count is not None:
        comp["multinode"] = {"nodeCount": node_count}
    return comp


def dgd_obj(*components: dict[str, Any], name: str = "llama", namespace: str = "default", status: dict | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        # The components list is v1beta1's form (v1alpha1 has the services map; a real server
        # prunes spec.components from a v1alpha1 object).
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {"components": [copy.deepcopy(c) for c in components]},
    }
    if status is not None:
        obj["status"] = status
    return obj


def disagg(prefill_cap: str = "350", decode_cap: str = "300", **kw: Any) -> dict[str, Any]:
    return dgd_obj(
        component("frontend", "frontend", gpus=None),
        component("prefill", "prefill", cap=prefill_cap, gpus="2", replicas=2),
        component("decode", "decode", cap=decode_cap, gpus=4, via="requests", node_count=2),
        **kw,
    )


def pod_obj(
    name: str,
    *,
    dgd: str = "llama",
    comp: str = "decode",
    cap: str | None = "300",
    node: str = "gpu-0",
    phase: str = "Running",
    namespace: str = "default",
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {LABEL_DGD_NAME: dgd, LABEL_COMPONENT: comp, **(extra_labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "labels": labels,
            "annotations": {} if cap is None else {POWER_ANNOTATION: cap},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "m"}]},
        "status": {"phase": phase},
    }
