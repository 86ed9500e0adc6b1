"""Seeding the real API server (in one namespace; cluster-scoped kinds as they are) as the loopback server's ``ApiServer.apply`` seeds its store: an object
created, or replaced at the version read, and its status written through the status subresource
(a create never keeps it). A DGD given in v1beta1 is written in v1alpha1, the one version the real
server serves here (crds.py), by the loopback server's own conversion. A pod with no node and no
scheduler named is pinned (``schedulerName: none``): nothing schedules it, it stays as written.
A node written Ready loses the ``node.kubernetes.io/not-ready`` taint the server's admission
(TaintNodesByCondition) puts on every new node, as the node lifecycle controller would."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from powerfleet.twin.apiserver.conversion import DGD_KEY, convert

Obj = dict[str, Any]
STORED_DGD_VERSION = "v1alpha1"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


@dataclass
class RealObjects:
    api: client.ApiClient
    namespace: str

    def __post_init__(self) -> None:
        self._dyn = dynamic.DynamicClient(self.api)

    def _as_stored(self, obj: Mapping[str, Any]) -> Obj:
        out = copy.deepcopy(dict(obj))
        if out.get("kind") == "DynamoGraphDeployment":
            out = convert(DGD_KEY, out, STORED_DGD_VERSION)
        meta = out.setdefault("metadata", {})
        for key in ("resourceVersion", "uid", "generation", "creationTimestamp"):
            meta.pop(key, None)
        spec = out.get("spec")
        if out.get("kind") == "Pod" and isinstance(spec, dict) and not spec.get("nodeName"):
            spec.setdefault("schedulerName", "none")
        return out

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create or replace ``obj`` in this namespace, then its status; returns what the server stored."""
        body = self._as_stored(obj)
        res = self._dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        ns = self.namespace if res.namespaced else None
        if ns:
            body["metadata"]["namespace"] = ns
        status = body.pop("status", None)
        name = body["metadata"]["name"]
        try:
            stored = res.create(body=body, namespace=ns).to_dict()
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = res.get(name=name, namespace=ns).to_dict()
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            stored = res.replace(body=body, namespace=ns).to_dict()
        if status:
            stored = res.subresources["status"].patch(
                body={"status": status}, name=name, namespace=ns,
                content_type="application/merge-patch+json").to_dict()
        if body["kind"] == "Node" and _ready(status):
            taints = [t for t in (stored.get("spec") or {}).get("taints") or [] if t.get("key") != NOT_READY_TAINT]
            if taints != ((stored.get("spec") or {}).get("taints") or []):
                stored = res.patch(body={"spec": {"taints": taints or None}}, name=name,
                                   content_type="application/merge-patch+json").to_dict()
        return dict(stored)

    def get(self, api_version: str, kind: str, name: str) -> Obj:
        res = self._dyn.resources.get(api_version=api_version, kind=kind)
        return res.get(name=name, namespace=self.namespace).to_dict()


def _ready(status: Mapping[str, Any] | None) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (status or {}).get("conditions") or [])
