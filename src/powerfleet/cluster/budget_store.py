"""Where the budget's own status lives: one ConfigMap per deployment, owned by powerfleet
(docs/budget.md, "Where the status lives"), plus one condition on the DGD's status.

Why a ConfigMap and not ``status.budget`` on the DGD: Dynamo's CRD declares no ``budget`` status
field, so a real API server prunes it and every evaluation would re-patch it and re-emit its
transition event. Why a ConfigMap and not a custom resource: nothing to install or version
beside the chart (no CRD, no conversion), every cluster serves it, ``kubectl get configmap
<dgd>-powerfleet-budget -o yaml`` reads it, and the ownerReference to the DGD lets the garbage
collector delete it with its deployment.

The condition (type ``powerfleet.io/PowerBudget``) is written with a JSON patch on the DGD's
status subresource that touches only its own list entry, located by index and guarded by a
``test`` of that entry's type, so the operator's conditions are never rewritten.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.dgd import DGD_API_VERSION, DGD_GROUP, DGD_KIND, DGD_PLURAL
from powerfleet.cluster.kube import JSON_PATCH, MERGE_PATCH, REQUEST_TIMEOUT_SECONDS, KubeCluster, _api_errors
from powerfleet.cluster.patch_errors import raise_for_patch
from powerfleet.cluster.ports import NotFound

SUFFIX = "-powerfleet-budget"
STATUS_KEY = "status.json"  # the whole status, canonical JSON (what powerfleet reads back)
READABLE_KEYS = ("ready", "reason", "message")  # copied as plain strings for kubectl's columns
LABEL_FOR = "powerfleet.io/budget-for"  # the DGD's name
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
CONDITION_TYPE = "powerfleet.io/PowerBudget"
# the condition is rewritten only when one of these changes (the reconcile contract: not for an
# observedGeneration that powerfleet's own replica write moved on, one PATCH per scale saved)
CONDITION_CHANGES = ("status", "reason", "message", "lastTransitionTime")


def status_object_name(dgd_name: str) -> str:
    return f"{dgd_name}{SUFFIX}"


@dataclass(frozen=True)
class StoredStatus:
    status: dict[str, Any]
    resource_version: str
    owner_uid: str  # the DGD uid it was written for ("" if none)


def stored_status(cm: Mapping[str, Any]) -> StoredStatus:
    """A ConfigMap (as JSON) -> the status it holds; an unreadable one reads as empty (rewritten)."""
    meta = cm.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, Mapping) and o.get("kind") == DGD_KIND]
    try:
        status = json.loads((cm.get("data") or {}).get(STATUS_KEY) or "{}")
    except ValueError:
        status = {}
    return StoredStatus(status=status if isinstance(status, dict) else {},
                        resource_version=str(meta.get("resourceVersion") or ""),
                        owner_uid=str(owners[0].get("uid") or "") if owners else "")


@dataclass(frozen=True)
class Owner:
    """The DGD a status belongs to (from its metadata, so an unparseable DGD has one too)."""

    namespace: str
    name: str
    uid: str
    api_version: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Owner:
        meta = obj.get("metadata") or {}
        return cls(namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name") or ""),
                   uid=str(meta.get("uid") or ""), api_version=str(obj.get("apiVersion") or DGD_API_VERSION))


def configmap_body(owner: Owner, status: Mapping[str, Any], resource_version: str | None = None) -> dict[str, Any]:
    data = {STATUS_KEY: json.dumps(dict(status), sort_keys=True)}
    data.update({k: str(status[k]) for k in READABLE_KEYS if k in status})
    meta: dict[str, Any] = {
        "name": status_object_name(owner.name), "namespace": owner.namespace,
        "labels": {LABEL_FOR: owner.name, LABEL_MANAGED_BY: "powerfleet"},
    }
    if owner.uid:
        meta["ownerReferences"] = [{"apiVersion": owner.api_version, "kind": DGD_KIND, "name": owner.name,
                                    "uid": owner.uid}]
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def condition_of(status: Mapping[str, Any]) -> dict[str, Any]:
    """The one DGD condition derived from the budget status (metav1.Condition's fields).

    It carries the deployment's budget state, not its figures: a planned deployment is within its
    budget or over it (reason ``OverBudget``), and only a change of that state rewrites it. Clamp
    and hold reasons, figures and the last scale are in the status ConfigMap; a condition that
    followed them cost one more PATCH per scale. A deployment not planned normally (ready False)
    keeps its status's message: it says why, and changes only with that cause.
    """
    ready, reason = str(status.get("ready", "Unknown")), str(status.get("reason"))
    if ready != "True":
        message = str(status.get("message", ""))
    elif status.get("overBudgetWatts") is not None:
        reason, message = "OverBudget", "over its power limit, shrinking toward it (figures: its budget status)"
    else:
        message = "within its power budget (clamps, holds and figures: its budget status)"
    out = {"type": CONDITION_TYPE, "status": ready, "reason": reason, "message": message[:1024],
           "lastTransitionTime": status.get("lastTransitionTime"), "observedGeneration": status.get("observedGeneration")}
    return {k: v for k, v in out.items() if v is not None}


def condition_patch(obj: Mapping[str, Any], condition: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """JSON patch ops writing ``condition`` into ``obj``'s status.conditions without touching any
    other entry; None when it is there already, unchanged."""
    status = obj.get("status")
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    fence = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []
    if not isinstance(status, Mapping):
        return [*fence, {"op": "add", "path": "/status", "value": {"conditions": [dict(condition)]}}]
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return [*fence, {"op": "add", "path": "/status/conditions", "value": [dict(condition)]}]
    for i, c in enumerate(conditions):
        if isinstance(c, Mapping) and c.get("type") == CONDITION_TYPE:
            if all(c.get(k) == condition.get(k) for k in CONDITION_CHANGES):
                return None  # its observedGeneration is the generation it last changed at
            return [{"op": "test", "path": f"/status/conditions/{i}/type", "value": CONDITION_TYPE},
                    {"op": "replace", "path": f"/status/conditions/{i}", "value": dict(condition)}]
    return [{"op": "add", "path": "/status/conditions/-", "value": dict(condition)}]


class KubeBudgetStore:
    """The status ConfigMaps and the DGD condition, on the official client (one call per method)."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self.core = client.CoreV1Api(cluster.api_client)

    def read_status(self, namespace: str, dgd_name: str) -> StoredStatus | None:
        name = status_object_name(dgd_name)
        try:
            with _api_errors(f"get ConfigMap {namespace}/{name}"):
                cm = self.core.read_namespaced_config_map(name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except NotFound:
            return None
        return stored_status(self.cluster.api_client.sanitize_for_serialization(cm))

    def write_status(self, owner: Owner, status: Mapping[str, Any], previous: StoredStatus | None) -> None:
        """Create the ConfigMap, or replace its data fenced on the version read (stale -> Conflict)."""
        name = status_object_name(owner.name)
        if previous is None:
            with _api_errors(f"create ConfigMap {owner.namespace}/{name}"):
                self.core.create_namespaced_config_map(owner.namespace, configmap_body(owner, status),
                                                       _request_timeout=REQUEST_TIMEOUT_SECONDS)
            return
        body = configmap_body(owner, status, previous.resource_version or None)
        # the data keys a merge patch would otherwise keep (a key the new status lacks) are dropped
        body["data"].update({k: None for k in READABLE_KEYS if k not in body["data"]})
        with _api_errors(f"patch ConfigMap {owner.namespace}/{name}"):
            self.core.patch_namespaced_config_map(name, owner.namespace, body, _request_timeout=REQUEST_TIMEOUT_SECONDS,
                                                  _content_type=MERGE_PATCH)

    def set_condition(self, obj: Mapping[str, Any], condition: Mapping[str, Any]) -> bool:
        """Write the budget condition on the DGD ``obj`` (as read); False when already there."""
        ops = condition_patch(obj, condition)
        if ops is None:
            return False
        owner = Owner.of(obj)
        namespace, name = owner.namespace, owner.name
        version = owner.api_version.rpartition("/")[2]
        what = f"patch DGD condition {namespace}/{name}"
        with _api_errors(what):
            try:
                self.cluster.custom.patch_namespaced_custom_object_status(
                    DGD_GROUP, version, namespace, DGD_PLURAL, name, ops,
                    _request_timeout=REQUEST_TIMEOUT_SECONDS, _content_type=JSON_PATCH)
            except ApiException as exc:
                raise_for_patch(what, exc)
        return True
