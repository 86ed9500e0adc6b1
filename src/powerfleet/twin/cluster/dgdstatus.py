"""The DGD status the twin's operator writes, in the field names of Dynamo's CRD (pure).

v1alpha1 form (the storage version): ``observedGeneration``, ``state``, ``conditions`` (one
``Ready``, with Dynamo's reason strings), ``services.<name>`` with ``componentKind``
(``Deployment``: single-node, non-Grove), ``componentName(s)``, ``replicas`` (non-terminated pods),
``updatedReplicas``, ``readyReplicas``, ``availableReplicas``, and ``rollingUpdate`` (``phase``,
``startTime``/``endTime``, ``updatedServices``: the worker components whose rollout finished).
It is the complete status the operator owns, as a typed ``Status().Update`` writes it: keys
Dynamo's type lacks are dropped unless ``keep_foreign`` (twin/fidelity.py) says otherwise; the
conditions it read are kept, its own ``Ready`` upserted by type, as Dynamo's operator does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from powerfleet.twin.cluster.kubelet import rfc3339

Obj = dict[str, Any]
# Every status property of Dynamo's DGD CRD (both versions); anything else is foreign.
CRD_STATUS_KEYS = frozenset({"checkpoints", "components", "conditions", "observedGeneration", "placement",
                             "restart", "rollingUpdate", "services", "state"})
WORKER_TYPES = frozenset({"worker", "prefill", "decode"})
READY_REASON, NOT_READY_REASON = "all_resources_are_ready", "some_resources_are_not_ready"


@dataclass(frozen=True)
class ComponentCounts:
    name: str
    type: str
    replicas: int  # non-terminated pods, old template included
    updated: int
    ready: int
    done: bool  # desired replicas ready on the current template, no old pod left


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def render(dgd_name: str, generation: int, counts: list[ComponentCounts], prev: Mapping[str, Any],
           now: float, *, keep_foreign: bool) -> Obj:
    all_done = all(c.done for c in counts)
    was = _map(prev.get("rollingUpdate"))
    prev_ready = next((_map(c) for c in prev.get("conditions") or [] if _map(c).get("type") == "Ready"), {})
    ready = "True" if all_done else "False"
    # A condition's lastTransitionTime moves only when its status does (metav1.Condition rules).
    since = prev_ready.get("lastTransitionTime") if prev_ready.get("status") == ready else None
    rolling: Obj = {"phase": "Completed" if all_done else "InProgress",
                    "updatedServices": sorted(c.name for c in counts if c.done and c.type in WORKER_TYPES)}
    if all_done:
        rolling["startTime"] = was.get("startTime") or rfc3339(now)
        rolling["endTime"] = was.get("endTime") if was.get("phase") == "Completed" and was.get("endTime") else rfc3339(now)
    else:
        rolling["startTime"] = was.get("startTime") if was.get("phase") == "InProgress" and was.get("startTime") else rfc3339(now)
    not_done = [c.name for c in counts if not c.done]
    status: Obj = {k: v for k, v in prev.items() if k not in CRD_STATUS_KEYS} if keep_foreign else {}
    status |= {
        "observedGeneration": generation,
        "state": "successful" if all_done else "pending",
        "rollingUpdate": rolling,
        "services": {c.name: {"componentKind": "Deployment", "componentName": f"{dgd_name}-{c.name}".lower(),
                              "componentNames": [f"{dgd_name}-{c.name}".lower()], "replicas": c.replicas,
                              "updatedReplicas": c.updated, "readyReplicas": c.ready, "availableReplicas": c.ready}
                     for c in counts},
        "conditions": set_condition(prev.get("conditions"), {
            "type": "Ready", "status": ready, "observedGeneration": generation,
            "reason": READY_REASON if all_done else NOT_READY_REASON,
            "message": "" if all_done else f"not ready: {', '.join(not_done)}",
            "lastTransitionTime": since or rfc3339(now)}),
    }
    return status


def set_condition(conditions: Any, condition: Obj) -> list[Obj]:
    """``conditions`` with ``condition`` put in by type: replaced where its type is, else appended.
    Dynamo's operator does this on the DGD it read (``AddStatusCondition``, then a
    ``Status().Update`` of that copy, 409 on a concurrent change), so a condition another
    controller wrote (powerfleet's ``powerfleet.io/PowerBudget``) stays."""
    out = [dict(c) for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []
    for i, c in enumerate(out):
        if c.get("type") == condition["type"]:
            out[i] = condition
            return out
    return [*out, condition]


def was_ready(prev: Mapping[str, Any]) -> bool:
    return any(_map(c).get("type") == "Ready" and _map(c).get("status") == "True" for c in prev.get("conditions") or [])
