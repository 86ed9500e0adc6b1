"""A scenario's tenants (twin/demo/scenario_model.py ``Tenant``): their pods, and the scheduler's part
for the ones that arrive without a node (pure).

A tenant is a pod of a workload the fleet does not manage (no DGD labels, so no DGD, budget or
retune reads it): its GPUs are taken, it draws power at its steady load, and with ``power_w``
it carries the power annotation its node's agent enforces. Bound to a node (``node``, or its
``rack``'s first node) it runs on that node's last free GPUs; with neither it is created
``Pending`` with ``PodScheduled=False Unschedulable``; the twin's scheduler (twin/cluster/scheduler.py,
run by the operator's passes) binds it when a node has room, as kube-scheduler would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from powerfleet.cluster.dgd import GPU_RESOURCE, POWER_ANNOTATION
from powerfleet.twin.cluster.operator import GPUS_ANNOTATION, pod_gpus
from powerfleet.twin.cluster.tenants import TENANT_LABEL
from powerfleet.twin.cluster.topology import TwinSpec

PENDING = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                               "message": "0 nodes have the free nvidia.com/gpu it requests"}]}
RUNNING = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                              {"type": "Ready", "status": "True"}]}


def tenant_gpus(pod: Mapping[str, Any]) -> int:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return int(((containers[0].get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE, "1"))


def free_gpus(spec: TwinSpec, pods: Sequence[Mapping[str, Any]]) -> dict[str, set[int]]:
    free = {n: set(range(spec.gpus_of(n))) for n in spec.node_names}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node in free:
            free[node] -= set(pod_gpus(p))
    return free


def tenant_pod(spec: TwinSpec, name: str, gpus: int, power_w: int | None, *, node: str | None,
               taken: dict[str, set[int]] | None = None, grace_s: int = 30,
               tolerations: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """The pod of one tenant; ``taken``: GPUs already given on each node (updated). ``tolerations``:
    the scheduler's part only: a tenant given its node is bound there as with ``nodeName`` (Kubernetes
    does not filter a bound pod by taints either)."""
    annotations: dict[str, str] = {}
    if power_w is not None:
        annotations[POWER_ANNOTATION] = str(power_w)
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": spec.namespace, "annotations": annotations,
                     "labels": {TENANT_LABEL: name, "app.kubernetes.io/name": name}},
        "spec": {"terminationGracePeriodSeconds": grace_s,
                 "containers": [{"name": "main", "image": f"example.com/{name}:1",
                                 "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}]},
        "status": PENDING,
    }
    if tolerations:
        pod["spec"]["tolerations"] = [dict(t) for t in tolerations]
    if node is None:
        return pod
    used = (taken or {}).get(node, set())
    free = sorted(set(range(spec.gpus_of(node))) - used)
    if len(free) < gpus:
        raise ValueError(f"tenant {name}: {node} has {len(free)} GPUs left, not {gpus}")
    chosen = free[-gpus:]
    if taken is not None:
        taken.setdefault(node, set()).update(chosen)
    return bound(pod, node, chosen)


def bound(pod: dict[str, Any], node: str, gpus: Sequence[int]) -> dict[str, Any]:
    """The pod bound to ``node`` on ``gpus``, Running and Ready."""
    pod = {**pod, "metadata": {**pod["metadata"], "annotations": {**(pod["metadata"].get("annotations") or {}),
                                                                  GPUS_ANNOTATION: ",".join(map(str, gpus))}},
           "spec": {**pod["spec"], "nodeName": node}, "status": RUNNING}
    return pod

