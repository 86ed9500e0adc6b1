"""Every pod that holds GPUs, with its GPU count: what a rack's ledger charges (issue 18 item 2).

One LIST of the cluster's pods per budget tick (API calls grow with the tick, not with pods x
deployments). A pod's GPUs are the ``nvidia.com/gpu`` of its containers (limits, else requests)
plus those of its native sidecars (init containers with ``restartPolicy: Always``, which hold
their devices for the pod's life); a plain init container's GPUs are released before the main
containers start and overlap them, so the pod holds the larger of the two sets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from powerfleet.cluster.dgd import GPU_RESOURCE, INT_RE
from powerfleet.cluster.kube import LIST_TIMEOUT_SECONDS, REQUEST_TIMEOUT_SECONDS, KubeCluster, _api_errors
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.placement import Placement, placement_of
from powerfleet.cluster.ports import ClusterError
from powerfleet.cluster.retries import with_retries


class GpuPod(PodInfo):
    gpus: int = 0  # nvidia.com/gpu the pod holds
    placement: Placement | None = None  # where it may be scheduled (None: not read)


def _container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        raw = (resources.get(key) or {}).get(GPU_RESOURCE)
        if raw is not None:
            text = str(raw).strip()
            return int(text) if INT_RE.fullmatch(text) else 0
    return 0


def pod_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs a pod spec (as JSON) holds: containers and native sidecars together, or its largest
    plain init container if that is more."""
    containers: Sequence[Mapping[str, Any]] = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    inits: Sequence[Mapping[str, Any]] = [c for c in spec.get("initContainers") or [] if isinstance(c, Mapping)]
    sidecars = sum(_container_gpus(c) for c in inits if c.get("restartPolicy") == "Always")
    plain = max((_container_gpus(c) for c in inits if c.get("restartPolicy") != "Always"), default=0)
    return max(sidecars + sum(_container_gpus(c) for c in containers), plain)


PAGE_SIZE = 500  # pods per page of the ledger's LIST (kubectl's chunk size)


class KubeGpuPods:
    """The ledger's pod LIST on the official client, in pages of ``page_size`` (``limit`` and
    ``continue``); a page answered 410 (its continue token expired) starts the list again, once."""

    def __init__(self, cluster: KubeCluster, page_size: int = PAGE_SIZE) -> None:
        self.cluster = cluster
        self.core = client.CoreV1Api(cluster.api_client)
        self.page_size = page_size
        self.pages_read = 0  # pages read by the last list_gpu_pods (for the bench)

    def _page(self, token: str | None, label_selector: str | None) -> Mapping[str, Any]:
        kwargs: dict[str, Any] = {"limit": self.page_size, "timeout_seconds": LIST_TIMEOUT_SECONDS,
                                  "_request_timeout": REQUEST_TIMEOUT_SECONDS, "_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if token:
            kwargs["_continue"] = token
        resp = with_retries(lambda: self.core.list_pod_for_all_namespaces(**kwargs))
        self.pages_read += 1
        got = json.loads(resp.data)
        return got if isinstance(got, Mapping) else {}

    def list_gpu_pods(self, label_selector: str | None = None) -> list[GpuPod]:
        """Every pod in the cluster (``label_selector``: only those) with its GPU count (pods without
        GPUs come back with 0). The response is read as JSON, not through the client's models: at
        thousands of pods that is most of a tick's time."""
        return self.list_gpu_pods_with_version(label_selector)[0]

    def list_gpu_pods_with_version(self, label_selector: str | None = None) -> tuple[list[GpuPod], str]:
        """``list_gpu_pods`` and the list's resourceVersion (every page of one list is the same
        snapshot; the last page carries its version), to watch from (gpu_pod_cache.py)."""
        self.pages_read = 0
        for fresh_start in (False, True):
            pods: list[GpuPod] = []
            token: str | None = None
            try:
                with _api_errors("list pods (all namespaces, for the ledger)"):
                    while True:
                        listed = self._page(token, label_selector)
                        # each page's pods to their ledger view at once: the raw JSON of one page is
                        # held at a time, not every page's (a real server's pod carries managedFields)
                        pods.extend(gpu_pod(p) for p in listed.get("items") or [] if isinstance(p, Mapping))
                        meta = listed.get("metadata") or {}
                        token = meta.get("continue") or None
                        if token is None:
                            return pods, str(meta.get("resourceVersion") or "")
            except ClusterError as exc:
                if exc.status != 410 or fresh_start:
                    raise
        raise AssertionError("unreachable")  # the second pass returns or raises

    def watch_gpu_pods(self, resource_version: str, *, timeout_seconds: int,
                       request_timeout: tuple[float, float]) -> Iterator[PodChange]:
        """Pod changes in every namespace after ``resource_version``, as ledger views, until the
        server ends the watch after ``timeout_seconds``; BOOKMARKs carry only a version. Each event
        is read as JSON (one pod's model built per event would cost the control worker's CPU on a
        busy cluster). A version the server no longer holds raises ``ClusterError`` with status 410."""
        with _api_errors("watch pods (all namespaces, for the ledger)"):
            resp = self.core.list_pod_for_all_namespaces(
                watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                timeout_seconds=timeout_seconds, _request_timeout=request_timeout, _preload_content=False)
            try:
                for line in iter_resp_lines(resp):
                    event = json.loads(line) if line and not line.isspace() else None
                    if not isinstance(event, Mapping):
                        continue
                    kind, obj = event.get("type"), event.get("object")
                    if not isinstance(obj, Mapping):
                        raise ClusterError(f"watch pods (all namespaces, for the ledger): a {kind} event without an object")
                    if kind == "ERROR":
                        raise ClusterError(f"watch pods (all namespaces, for the ledger): HTTP {obj.get('code')} "
                                           f"{obj.get('reason')}: {obj.get('message')}", status=_int_or_none(obj.get("code")))
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                    if kind == "BOOKMARK":
                        yield PodChange("BOOKMARK", None, version)
                    elif kind in ("ADDED", "MODIFIED", "DELETED"):
                        yield PodChange(kind, gpu_pod(obj), version)
            finally:
                resp.close()
                resp.release_conn()


class PodChange(NamedTuple):
    """One event of the ledger's pod watch: ``pod`` is None for a BOOKMARK."""

    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    pod: GpuPod | None
    resource_version: str


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def gpu_pod(obj: Mapping[str, Any]) -> GpuPod:
    """A pod as the API returns it (JSON) -> its ledger view."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return GpuPod(name=str(meta.get("name") or ""), namespace=str(meta.get("namespace") or ""),
                  uid=str(meta.get("uid") or ""), node_name=spec.get("nodeName") or None,
                  phase=status.get("phase") or None, labels=dict(meta.get("labels") or {}),
                  annotations=dict(meta.get("annotations") or {}),
                  terminating=meta.get("deletionTimestamp") is not None,
                  resource_version=str(meta.get("resourceVersion") or ""), gpus=pod_gpus(spec),
                  placement=placement_of(spec) if isinstance(spec, Mapping) else None)
