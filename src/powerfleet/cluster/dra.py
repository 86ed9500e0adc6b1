"""The device classes a DGD's DRA claims ask for, from their ResourceClaimTemplates (issue 18
item 7): a claim for an IMEX ComputeDomain channel (GB200/GB300 manifests) allocates no GPU, so
the component's ``nvidia.com/gpu`` count stays readable; only a claim that allocates GPUs, or
whose template cannot be read, refuses power awareness (cluster/power.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client

from powerfleet.cluster.kube import LIST_TIMEOUT_SECONDS, REQUEST_TIMEOUT_SECONDS, KubeCluster, _api_errors
from powerfleet.cluster.ports import NotFound


def device_classes(template: Mapping[str, Any]) -> tuple[str, ...]:
    """The deviceClassName of every request of a ResourceClaimTemplate (as JSON): resource.k8s.io/v1
    (``exactly`` / ``firstAvailable``) and v1beta1 (on the request itself)."""
    node: Any = template
    for key in ("spec", "spec", "devices", "requests"):  # a missing or odd-shaped level reads as none
        node = node.get(key) if isinstance(node, Mapping) else None
    out: list[str] = []
    for r in node if isinstance(node, list) else []:
        if not isinstance(r, Mapping):
            continue
        alternatives = r.get("firstAvailable")
        options = [r, r.get("exactly"), *(alternatives if isinstance(alternatives, list) else [])]
        out.extend(str(o["deviceClassName"]) for o in options if isinstance(o, Mapping) and o.get("deviceClassName"))
    return tuple(out)


class KubeDra:
    """ResourceClaimTemplates on the official client (resource.k8s.io/v1)."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self.resource = client.ResourceV1Api(cluster.api_client)

    def list_claim_templates(self, namespace: str) -> dict[str, tuple[str, ...]]:
        """Template name -> its device classes, in one namespace (none where DRA is not served)."""
        try:
            with _api_errors(f"list ResourceClaimTemplates in {namespace}"):
                listed = self.resource.list_namespaced_resource_claim_template(
                    namespace, timeout_seconds=LIST_TIMEOUT_SECONDS, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except NotFound:
            return {}
        items = self.cluster.api_client.sanitize_for_serialization(listed).get("items", [])
        return {str((t.get("metadata") or {}).get("name")): device_classes(t) for t in items}
