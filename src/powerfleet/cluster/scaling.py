"""Who owns a DGD component's replicas, and writing them through the owner (issue 18 item 6).

Dynamo's operator may create a DynamoGraphDeploymentScalingAdapter (DGDSA) per component; its
``spec.replicas`` then owns the count (the adapter controller copies it onto the DGD and would
overwrite a write to the DGD). Such a component is scaled through the adapter's
``spec.replicas``, never by patching the DGD. Adapters are read with one LIST per namespace;
a cluster that does not serve the CRD has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.dgd import DGD_GROUP
from powerfleet.cluster.kube import JSON_PATCH, LIST_TIMEOUT_SECONDS, REQUEST_TIMEOUT_SECONDS, KubeCluster, _api_errors
from powerfleet.cluster.patch_errors import raise_for_patch
from powerfleet.cluster.ports import NotFound

ADAPTER_PLURAL = "dynamographdeploymentscalingadapters"
ADAPTER_VERSIONS = ("v1beta1", "v1alpha1")  # the first one served is read


@dataclass(frozen=True)
class ScalingAdapter:
    name: str
    namespace: str
    dgd: str  # spec.dgdRef.name
    component: str  # spec.dgdRef.componentName (v1beta1) or serviceName (v1alpha1)
    replicas: int | None
    resource_version: str
    version: str


def adapter_of(obj: Mapping[str, Any], version: str) -> ScalingAdapter | None:
    """A DGDSA as JSON -> its view; None when it names no DGD component (a component group, or malformed)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    ref = spec.get("dgdRef") if isinstance(spec.get("dgdRef"), Mapping) else {}
    component = ref.get("componentName") or ref.get("serviceName")
    if not isinstance(ref.get("name"), str) or not isinstance(component, str):
        return None
    replicas = spec.get("replicas")
    return ScalingAdapter(name=str(meta.get("name")), namespace=str(meta.get("namespace") or ""), dgd=ref["name"],
                          component=component,
                          replicas=replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None,
                          resource_version=str(meta.get("resourceVersion") or ""), version=version)


class KubeScaling:
    """Scaling adapters on the official client (one call per method)."""

    def __init__(self, cluster: KubeCluster, *, recheck_s: float = 300.0) -> None:
        self.cluster = cluster
        self.recheck_s = recheck_s  # how long "the CRD is not served" is believed before asking again
        self._absent_since: float | None = None

    def list_scaling_adapters(self, namespace: str) -> list[ScalingAdapter]:
        """Every adapter in ``namespace``; none where the cluster serves no DGDSA version (then not
        asked again for ``recheck_s``, so a cluster without adapters costs no call per evaluation)."""
        now = self.cluster.clock.now()
        if self._absent_since is not None and now - self._absent_since < self.recheck_s:
            return []
        for version in ADAPTER_VERSIONS:
            try:
                with _api_errors(f"list scaling adapters in {namespace}"):
                    listed = self.cluster.custom.list_namespaced_custom_object(
                        DGD_GROUP, version, namespace, ADAPTER_PLURAL,
                        timeout_seconds=LIST_TIMEOUT_SECONDS, _request_timeout=REQUEST_TIMEOUT_SECONDS)
            except NotFound:
                continue
            self._absent_since = None
            return [a for item in listed.get("items", []) if (a := adapter_of(item, version)) is not None]
        self._absent_since = now
        return []

    def patch_adapter_replicas(self, adapter: ScalingAdapter, replicas: int) -> None:
        """Replace the adapter's spec.replicas, fenced on the version read (changed -> Conflict;
        refused by the server -> Rejected with its message)."""
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": adapter.resource_version},
               {"op": "replace", "path": "/spec/replicas", "value": replicas}]
        what = f"patch scaling adapter {adapter.namespace}/{adapter.name} replicas"
        with _api_errors(what):
            try:
                self.cluster.custom.patch_namespaced_custom_object(
                    DGD_GROUP, adapter.version, adapter.namespace, ADAPTER_PLURAL, adapter.name, ops,
                    _request_timeout=REQUEST_TIMEOUT_SECONDS, _content_type=JSON_PATCH)
            except ApiException as exc:
                raise_for_patch(what, exc)
