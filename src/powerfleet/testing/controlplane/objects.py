"""Seeding the real API server as the loopback server's ``ApiServer.apply`` seeds its store: an object
created, or replaced at the version read, and its status written through the status subresource
(a create never keeps it). A DGD given in v1beta1 is written in v1alpha1, the one version the real
server serves here (crds.py), by the loopback server's own conversion. A pod with no node and no
scheduler named is pinned (``schedulerName: none``): nothing schedules it, it stays as written."""

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
        meta["namespace"] = self.namespace
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
        status = body.pop("status", None)
        name = body["metadata"]["name"]
        try:
            stored = res.create(body=body, namespace=self.namespace).to_dict()
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = res.get(name=name, namespace=self.namespace).to_dict()
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            stored = res.replace(body=body, namespace=self.namespace).to_dict()
        if status:
            stored = res.subresources["status"].patch(
                body={"status": status}, name=name, namespace=self.namespace,
                content_type="application/merge-patch+json").to_dict()
        return stored

    def get(self, api_version: str, kind: str, name: str) -> Obj:
        res = self._dyn.resources.get(api_version=api_version, kind=kind)
        return res.get(name=name, namespace=self.namespace).to_dict()
