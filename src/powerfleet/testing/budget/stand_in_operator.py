"""A stand-in for the Dynamo operator in budget tests: makes a DGD's pods and status match its
spec in one step (pods Running with the cap annotation copied verbatim, every replica ready).

It writes the status with a merge patch of the operator's own keys, so powerfleet's condition
survives, as beside a real operator that patches its own fields; each component's entry carries
what Dynamo's CRD requires of it (``componentKind``, ``replicas``, ``updatedReplicas``), as the
loopback server validates status like a real server.
"""

from __future__ import annotations

from typing import Any

from powerfleet.cluster.budget_store import status_object_name, stored_status
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION, parse_dgd
from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.apiserver.errors import ApiError


def dgd(name: str, prefill: int, decode: int, *, cap: str = "500", namespace: str = "default") -> dict[str, Any]:
    def comp(cname: str, ctype: str, replicas: int) -> dict[str, Any]:
        return {"name": cname, "type": ctype, "replicas": replicas, "podTemplate": {
            "metadata": {"annotations": {POWER_ANNOTATION: cap}},
            "spec": {"containers": [{"name": "main", "image": "engine", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    return {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"components": [{"name": "Frontend", "type": "frontend", "replicas": 1},
                                    comp("prefill", "prefill", prefill), comp("decode", "decode", decode)]}}


def settle(api: ApiServer, kube: KubeCluster, name: str, nodes: list[str], namespace: str = "default", *,
           with_gpus: bool = False) -> None:
    """``with_gpus``: each pod's container requests its component's ``nvidia.com/gpu``, as a real
    pod from the template does (False: none, so no node's free GPU count sees them)."""
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
                    "spec": {"nodeName": nodes[i % len(nodes)], "containers": [{"name": "main", "image": "engine", **(
                        {"resources": {"limits": {"nvidia.com/gpu": str(c.gpus_per_pod)}}} if with_gpus else {})}]},
                    "status": {"phase": "Running"}}
            if pod not in existing or api.get("v1", "Pod", pod, namespace)["metadata"].get("annotations") != c.annotations:
                api.apply(body)
        components[c.name] = component_status(name, c.name, c.replicas, ready=c.replicas)
    for pod in existing - wanted:
        api.delete("v1", "Pod", pod, namespace)
    kube.patch_dgd_status(namespace, name, {"observedGeneration": d.generation, "state": "successful",
                                            "rollingUpdate": {"phase": "Completed"}, "components": components})


def component_status(dgd_name: str, component: str, replicas: int, *, ready: int) -> dict[str, Any]:
    """One v1beta1 ``status.components`` entry as Dynamo's operator writes it (a single-node
    component is a Deployment)."""
    return {"componentKind": "Deployment", "componentNames": [f"{dgd_name}-{component}".lower()],
            "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready, "availableReplicas": ready}


def replicas(api: ApiServer, name: str, namespace: str = "default") -> dict[str, int]:
    d = parse_dgd(api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", name, namespace))
    return {c.name: c.replicas for c in d.components if c.name != "Frontend"}


def budget_status(api: ApiServer, name: str, namespace: str = "default") -> dict[str, Any]:
    """The budget's status as powerfleet persisted it in its ConfigMap (the default
    ``budget.status_store``); empty when none was written."""
    try:
        cm = api.get("v1", "ConfigMap", status_object_name(name), namespace)
    except ApiError as exc:
        if exc.code == 404:
            return {}
        raise
    return stored_status(cm).status
