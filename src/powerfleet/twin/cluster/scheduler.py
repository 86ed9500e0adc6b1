"""The twin's scheduler, pure: which node a pod may be bound to, as kube-scheduler's filters decide
(issue 30 item 2; docs/twin.md "Fidelity").

Filters, in kube-scheduler's order: ``NodeUnschedulable`` (a cordoned node), ``NodeAffinity``
(``nodeSelector`` and the required node affinity, read by cluster/placement.py), ``TaintToleration``
(every ``NoSchedule``/``NoExecute`` taint tolerated; ``PreferNoSchedule`` only scores) and
``NodeResourcesFit`` for ``nvidia.com/gpu`` (allocatable minus what the pods bound there request,
Terminating ones included, Succeeded and Failed ones not). Among the nodes that pass, the one with
the most free GPUs wins (spreading), ties to the first in order. The device plugin's part, which
GPU indices a pod gets, is here too. A pod that fits nowhere gets the message a real scheduler
writes in its ``PodScheduled=False`` condition (reason ``Unschedulable``) and stays Pending until
a later pass finds room.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from powerfleet.cluster.dgd import GPU_RESOURCE
from powerfleet.cluster.gpu_pods import pod_gpus as spec_gpus
from powerfleet.cluster.placement import placement_of

GPUS_ANNOTATION = "twin.powerfleet.io/gpus"  # the GPU indices the device plugin gave a pod
_FILTERING = ("NoSchedule", "NoExecute")
_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
_INSUFFICIENT = f"Insufficient {GPU_RESOURCE}"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: int  # status.allocatable["nvidia.com/gpu"]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    unschedulable: bool = False  # spec.unschedulable (cordoned)


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """A Node (JSON, as the API serves it) -> what the scheduler reads of it."""
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    raw = str(_map(status.get("allocatable")).get(GPU_RESOURCE, "0") or "0").strip()
    return NodeView(str(meta.get("name") or ""), int(raw) if raw.isdigit() else 0,
                    {str(k): str(v) for k, v in _map(meta.get("labels")).items()},
                    tuple(t for t in spec.get("taints") or [] if isinstance(t, Mapping)),
                    bool(spec.get("unschedulable")))


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``: effect, key and value (or ``Exists``) match."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (op == "Equal" and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def pod_gpu_indices(pod: Mapping[str, Any]) -> list[int]:
    raw = _map(_map(pod.get("metadata")).get("annotations")).get(GPUS_ANNOTATION, "")
    return [int(x) for x in str(raw).split(",") if x.strip().isdigit()]


def _holds_gpus(pod: Mapping[str, Any]) -> bool:
    return str(_map(pod.get("status")).get("phase") or "Pending") not in ("Succeeded", "Failed")


class Scheduler:
    """Free GPU indices per node, updated as a pass binds pods. ``nodes``: NodeViews in order, or
    (the short form) node name -> GPU count, for nodes without labels or taints."""

    def __init__(self, nodes: Sequence[NodeView] | Mapping[str, int], pods: Sequence[Mapping[str, Any]]) -> None:
        views = [NodeView(n, c) for n, c in nodes.items()] if isinstance(nodes, Mapping) else list(nodes)
        self.nodes = {v.name: v for v in views}
        self.order = [v.name for v in views]
        self.free = {v.name: set(range(v.gpus)) for v in views}
        for p in pods:
            node = _map(p.get("spec")).get("nodeName")
            if node not in self.free or not _holds_gpus(p):
                continue
            taken = pod_gpu_indices(p)
            if not taken:  # bound without indices (created by someone else): its requests, lowest first
                taken = sorted(self.free[node])[:spec_gpus(_map(p.get("spec")))]
            self.free[node] -= set(taken)

    def _rejects(self, node: NodeView, spec: Mapping[str, Any], gpus: int) -> str | None:
        """Why ``node`` cannot take a pod of ``spec`` (None: it can), in kube-scheduler's words."""
        if node.unschedulable and not tolerates(spec.get("tolerations") or [], {
                "key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return "node(s) were unschedulable"
        if not placement_of(spec).admits(node.name, node.labels):
            return _AFFINITY
        tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
        for taint in node.taints:
            if taint.get("effect") in _FILTERING and not tolerates(tolerations, taint):
                return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
        if len(self.free[node.name]) < gpus:
            return _INSUFFICIENT
        return None

    def place(self, spec: Mapping[str, Any], gpus: int) -> tuple[str, list[int]] | str:
        """Bind a pod of ``spec`` holding ``gpus``: (node, GPU indices), or the Unschedulable message."""
        why: Counter[str] = Counter()
        fits = []
        for name in self.order:
            reason = self._rejects(self.nodes[name], spec, gpus)
            if reason is None:
                fits.append(name)
            else:
                why[reason] += 1
        if not fits:
            n = len(self.order)
            detail = ", ".join(f"{count} {reason}" for reason, count in sorted(why.items()))
            return (f"0/{n} nodes are available: {detail}. preemption: 0/{n} nodes are available: "
                    f"{n} Preemption is not helpful for scheduling.")
        node = max(fits, key=lambda n: (len(self.free[n]), -self.order.index(n)))
        chosen = sorted(self.free[node])[:gpus]
        self.free[node] -= set(chosen)
        return node, chosen

    def release(self, pod: Mapping[str, Any]) -> None:
        node = _map(pod.get("spec")).get("nodeName")
        if node in self.free:
            self.free[node] |= set(pod_gpu_indices(pod))


def unschedulable(message: str) -> dict[str, Any]:
    """The condition kube-scheduler writes on a pod it could not bind."""
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
