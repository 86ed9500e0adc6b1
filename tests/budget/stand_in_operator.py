"""A stand-in for the Dynamo operator in budget tests: makes a DGD's pods and status match its
spec in one step (pods Running with the cap annotation copied verbatim, every replica ready).

It writes the status with a merge patch of the operator's own keys, so powerfleet's condition
(and ``status.budget`` with ``budget.status_store: dgd``) survives, as beside a real operator
that patches its own fields.
"""

from __future__ import annotations

from typing import Any

from powerfleet.cluster.budget_store import status_object_name, stored_status
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION, parse_dgd
from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.apiserver.errors import ApiError
from powerfleet.twin.apiserver.resources import ResourceType


def dgd(name: str, prefill: int, decode: int, *, cap: str = "500", namespace: str = "default") -> dict[str, Any]:
    def comp(cname: str, ctype: str, replicas: int) -> dict[str, Any]:
        return {"name": cname, "type": ctype, "replicas": replicas, "podTemplate": {
            "metadata": {"annotations": {POWER_ANNOTATION: cap}},
            "spec": {"containers": [{"name": "main", "image": "engine", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    return {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"components": [{"name": "Frontend", "type": "frontend", "replicas": 1},
                                    comp("prefill", "prefill", prefill), comp("decode", "decode", decode)]}}


def settle(api: ApiServer, kube: KubeCluster, name: str, nodes: list[str], namespace: str = "default") -> None:
    obj = api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", name, namespace)
    d = parse_dgd(obj)
    existing = {p["metadata"]["name"] for p in api.list("v1", "Pod", namespace)
                if p["metadata"].get("labels", {}).get(LABEL_DGD_NAME) == name}
    wanted: set[str] = set()
    components: dict[str, Any] = {}
    for c in d.components:
        for i in range(c.replicas * c.effective_node_count):
            pod = f"{name}-{c.name.lower()}-{i}"
            wanted.add(pod)
            body = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "namespace": namespace, "labels": {LABEL_DGD_NAME: name, LABEL_COMPONENT: c.name},
                                 "annotations": dict(c.annotations)},
                    "spec": {"nodeName": nodes[i % len(nodes)], "containers": [{"name": "main", "image": "engine"}]},
                    "status": {"phase": "Running"}}
            if pod not in existing or api.get("v1", "Pod", pod, namespace)["metadata"].get("annotations") != c.annotations:
                api.apply(body)
        components[c.name] = {"replicas": c.replicas, "readyReplicas": c.replicas, "updatedReplicas": c.replicas,
                              "rollout": {"phase": "Completed"}}
    for pod in existing - wanted:
        api.delete("v1", "Pod", pod, namespace)
    kube.patch_dgd_status(namespace, name, {"observedGeneration": d.generation, "state": "successful",
                                            "rollingUpdate": {"phase": "Completed"}, "components": components})


def replicas(api: ApiServer, name: str, namespace: str = "default") -> dict[str, int]:
    d = parse_dgd(api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", name, namespace))
    return {c.name: c.replicas for c in d.components if c.name != "Frontend"}


CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap")


def serve_configmaps(api: ApiServer) -> ApiServer:
    """The loopback server serves no ConfigMaps by default; the budget's status lives in one."""
    api.register(CONFIGMAPS)
    return api


def budget_status(api: ApiServer, name: str, namespace: str = "default") -> dict[str, Any]:
    """The budget's status as powerfleet persisted it: its ConfigMap where the server serves them
    (``serve_configmaps``), else ``status.budget`` on the DGD (``budget.status_store: dgd``)."""
    try:
        cm = api.get("v1", "ConfigMap", status_object_name(name), namespace)
    except ValueError:  # ConfigMaps not served: the runner's DGD store
        return dgd_budget_status(api, name, namespace)
    except ApiError as exc:
        if exc.code == 404:
            return {}
        raise
    return stored_status(cm).status


def dgd_budget_status(api: ApiServer, name: str, namespace: str = "default") -> dict[str, Any]:
    """``status.budget`` on the DGD (budget.status_store: dgd)."""
    return (api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", name, namespace).get("status") or {}).get("budget") or {}


def start_rollout(api: ApiServer, kube: KubeCluster, name: str, nodes: list[str], namespace: str = "default") -> None:
    """The first half of a slow operator's step: the pods a raised spec needs are created but not
    yet Running (startup), so status reports the new spec count with only the old ones ready."""
    d = parse_dgd(api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", name, namespace))
    pods = [p for p in api.list("v1", "Pod", namespace) if p["metadata"].get("labels", {}).get(LABEL_DGD_NAME) == name]
    components: dict[str, Any] = {}
    for c in d.components:
        mine = [p for p in pods if p["metadata"]["labels"].get(LABEL_COMPONENT) == c.name]
        running = sum(1 for p in mine if p.get("status", {}).get("phase") == "Running")
        for i in range(len(mine), c.replicas * c.effective_node_count):
            api.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": f"{name}-{c.name.lower()}-{i}", "namespace": namespace,
                                    "labels": {LABEL_DGD_NAME: name, LABEL_COMPONENT: c.name},
                                    "annotations": dict(c.annotations)},
                       "spec": {"nodeName": nodes[i % len(nodes)], "containers": [{"name": "main", "image": "engine"}]},
                       "status": {"phase": "Pending"}})
        components[c.name] = {"replicas": c.replicas, "readyReplicas": running // c.effective_node_count,
                              "updatedReplicas": c.replicas}
    kube.patch_dgd_status(namespace, name, {"observedGeneration": d.generation, "components": components})
