"""Other tenants: GPU pods on the twin's racks that belong to deployments the fleet does not
manage, as a shared rack carries them (docs/twin.md, "Other tenants").

Each rack's first node runs one pod of each tenant: ``train-job`` carries the power annotation
(its GPU is capped by the node's agent like any annotated pod), ``batch-infer`` carries none (its
GPU runs at the default limit). Neither has the DGD labels, so no DGD, budget or retune reads
them; their GPUs are taken (the twin's scheduler counts them) and they draw power at a steady
load, so a rack's measured power includes what the fleet does not plan.

A third, ``queued-train`` (2 GPUs, capped at 400 W), is **Pending**: it asks for nodes labelled
``powerfleet.io/twin-pool=training`` and no node has that label, so the twin's scheduler leaves it
unbound with ``PodScheduled=False``, reason ``Unschedulable``, as kube-scheduler does; label a
node (with 2 GPUs free) and the next operator pass binds it there (twin/cluster/scheduler.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerfleet.cluster.dgd import GPU_RESOURCE, POWER_ANNOTATION
from powerfleet.twin.cluster.operator import GPUS_ANNOTATION
from powerfleet.twin.cluster.topology import TwinSpec

TENANT_LABEL = "powerfleet.io/twin-tenant"


@dataclass(frozen=True)
class Tenant:
    name: str
    cap_w: int | None  # the power annotation its pods carry (None: none)
    load: float  # steady utilisation of its GPU, 0..1


TENANTS: tuple[Tenant, ...] = (Tenant("train-job", 300, 0.5), Tenant("batch-infer", None, 0.2))
PENDING = Tenant("queued-train", 400, 0.6)  # waits for a pool no node is in
POOL_LABEL = "powerfleet.io/twin-pool"


def tenant_pods(spec: TwinSpec) -> list[dict[str, Any]]:
    """One Running, Ready pod per tenant per rack, on the rack's first node's last GPUs. None on
    a one-node twin: its two DGDs fill that node's eight GPUs."""
    out: list[dict[str, Any]] = []
    if spec.nodes < 2:
        return out
    for rack, nodes in spec.racks.items():
        node = nodes[0]
        for i, tenant in enumerate(TENANTS):
            gpu = spec.gpus_per_node - 1 - i
            annotations = {GPUS_ANNOTATION: str(gpu)}
            if tenant.cap_w is not None:
                annotations[POWER_ANNOTATION] = str(tenant.cap_w)
            out.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{tenant.name}-{rack}", "namespace": spec.namespace, "annotations": annotations,
                             "labels": {TENANT_LABEL: tenant.name, "app.kubernetes.io/name": tenant.name}},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                         "containers": [{"name": "main", "image": f"example.com/{tenant.name}:1",
                                         "resources": {"limits": {GPU_RESOURCE: "1"}}}]},
                "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                                              {"type": "Ready", "status": "True"}]},
            })
    out.append(pending_tenant_pod(spec))
    return out


def pending_tenant_pod(spec: TwinSpec) -> dict[str, Any]:
    """The tenant that fits nowhere yet: Pending, with the condition kube-scheduler writes."""
    from powerfleet.twin.cluster.scheduler import unschedulable

    n = spec.nodes
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": PENDING.name, "namespace": spec.namespace,
                     "annotations": {POWER_ANNOTATION: str(PENDING.cap_w)},
                     "labels": {TENANT_LABEL: PENDING.name, "app.kubernetes.io/name": PENDING.name}},
        "spec": {"nodeSelector": {POOL_LABEL: "training"}, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "main", "image": f"example.com/{PENDING.name}:1",
                                 "resources": {"limits": {GPU_RESOURCE: "2"}}}]},
        "status": {"phase": "Pending", "conditions": [unschedulable(
            f"0/{n} nodes are available: {n} node(s) didn't match Pod's node affinity/selector. "
            f"preemption: 0/{n} nodes are available: {n} Preemption is not helpful for scheduling.")]},
    }


def tenant_loads(pods: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Pod name -> utilisation, for the tenants' running pods."""
    load = {t.name: t.load for t in (*TENANTS, PENDING)}
    return {str(p["metadata"]["name"]): load[tenant] for p in pods
            if (tenant := (p["metadata"].get("labels") or {}).get(TENANT_LABEL)) in load
            and (p.get("status") or {}).get("phase") == "Running"}
