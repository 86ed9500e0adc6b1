"""The node agent's one write: an annotation on a pod of its node (Dynamo's enforcement report).

A merge patch of ``metadata.annotations`` only, with the pod's ``uid`` (and, when given, its
``resourceVersion``) as preconditions, so a replaced pod or a concurrent change is a 409
(``Conflict``) rather than a silent overwrite; and the read that a retry after a 409 starts
from. The chart grants the agent ``get`` and ``patch`` on pods for these two calls and nothing
else, and its ValidatingAdmissionPolicy lets the agent's ServiceAccount change only the report
annotation, only on pods of its own node (charts/powerfleet/templates/agent-admission.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client

from powerfleet.cluster.kube import MERGE_PATCH, KubeCluster, _api_errors, pod_info
from powerfleet.cluster.objects import PodInfo

TIMEOUT_S = 5.0  # one bounded request; the agent's client has no retries behind it


class KubePodAnnotations:
    """The agent's pod-annotation calls on the official client (through ``KubeCluster``'s connection)."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.core = client.CoreV1Api(cluster.api_client)

    def get_pod(self, namespace: str, name: str) -> PodInfo:
        with _api_errors(f"get pod {namespace}/{name}"):
            return pod_info(self.core.read_namespaced_pod(name, namespace, _request_timeout=TIMEOUT_S))

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None], *, uid: str,
                              resource_version: str | None = None) -> PodInfo:
        """Set (or, with None, remove) these annotations and nothing else."""
        meta: dict[str, Any] = {"uid": uid, "annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        with _api_errors(f"patch pod {namespace}/{name} annotations"):
            return pod_info(self.core.patch_namespaced_pod(name, namespace, {"metadata": meta},
                                                           _request_timeout=TIMEOUT_S, _content_type=MERGE_PATCH))
