"""The cluster ports on the official ``kubernetes`` client.

Every method does exactly one kind of API call (the name says which); HTTP 404 becomes
``NotFound``, 409 becomes ``Conflict`` (``LeaseConflict`` for Leases), anything else (including
transport errors) ``ClusterError``. Invalid DGDs raise ``DGDInputError`` *before* any write.
"""

from __future__ import annotations

import json

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from powerfleet.clock import Clock, SystemClock
from powerfleet.cluster.dgd import DGD, DGD_GROUP, DGD_PLURAL, DGD_VERSIONS, parse_dgd
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.objects import EventInfo, Lease, NodeInfo, ObjectRef, PodInfo, gpu_allocatable
from powerfleet.cluster.patch_errors import raise_for_patch
from powerfleet.cluster.ports import ClusterError, Conflict, InvalidDGD, LeaseConflict, NotFound, PodEvent
from powerfleet.cluster.retries import with_retries

LIST_TIMEOUT_SECONDS = 20  # server-side timeout for LISTs
REQUEST_TIMEOUT_SECONDS = 25.0  # client-side timeout for every call
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@contextmanager
def _api_errors(what: str, conflict: type[Conflict] = Conflict) -> Iterator[None]:
    try:
        yield
    except ApiException as exc:
        detail = f"{what}: HTTP {exc.status} {exc.reason}"
        if exc.status == 404:
            raise NotFound(detail, status=404) from exc
        if exc.status == 409:
            raise conflict(detail, status=409) from exc
        raise ClusterError(detail, status=exc.status) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterError(f"{what}: {type(exc).__name__}: {exc}") from exc


def pod_info(pod: client.V1Pod) -> PodInfo:
    meta, spec, status = pod.metadata, pod.spec, pod.status
    return PodInfo(
        name=meta.name,
        namespace=meta.namespace or "",
        uid=meta.uid or "",
        node_name=spec.node_name if spec else None,
        phase=status.phase if status else None,
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        terminating=meta.deletion_timestamp is not None,
        resource_version=meta.resource_version or "",
        ready=any(c.type == "Ready" and c.status == "True" for c in (status.conditions or [])) if status else False,
        started_containers=_started_containers(status),
    )


def _started_containers(status: client.V1PodStatus | None) -> tuple[str, ...]:
    out = []
    for c in (status.container_statuses or []) if status else []:
        running = c.state.running if c.state else None
        if running is not None:
            since = running.started_at.isoformat() if running.started_at else f"restart {c.restart_count}"
            out.append(f"{c.name}@{since}")
    return tuple(sorted(out))


def lease_info(lease: client.V1Lease) -> Lease:
    meta, spec = lease.metadata, lease.spec
    return Lease(
        name=meta.name,
        namespace=meta.namespace or "",
        holder_identity=spec.holder_identity if spec else None,
        lease_duration_seconds=spec.lease_duration_seconds if spec else None,
        acquire_time=spec.acquire_time if spec else None,
        renew_time=spec.renew_time if spec else None,
        lease_transitions=spec.lease_transitions if spec else None,
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        resource_version=meta.resource_version or "",
        uid=meta.uid or "",
    )


class MicroTime(datetime):
    """A Lease's ``acquireTime``/``renewTime`` as the real server parses a MicroTime: always six
    fraction digits. The client serialises a datetime with ``isoformat``, which drops the fraction
    at a whole second, and kube-apiserver then refuses the whole Lease with 400 (the loopback
    server took it). The client's models keep this subclass as it is."""

    def isoformat(self, sep: str = "T", timespec: str = "microseconds") -> str:
        return super().isoformat(sep, timespec)


def micro_time(at: datetime | None) -> MicroTime | None:
    if at is None:
        return None
    at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
    return MicroTime(at.year, at.month, at.day, at.hour, at.minute, at.second, at.microsecond, tzinfo=UTC)


def _lease_body(lease: Lease) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(
            name=lease.name,
            namespace=lease.namespace,
            labels=lease.labels or None,
            annotations=lease.annotations or None,
            resource_version=lease.resource_version or None,
        ),
        spec=client.V1LeaseSpec(
            holder_identity=lease.holder_identity,
            lease_duration_seconds=lease.lease_duration_seconds,
            acquire_time=micro_time(lease.acquire_time),
            renew_time=micro_time(lease.renew_time),
            lease_transitions=lease.lease_transitions,
        ),
    )


def event_info(ev: client.CoreV1Event) -> EventInfo:
    io = ev.involved_object
    return EventInfo(
        name=ev.metadata.name,
        namespace=ev.metadata.namespace or "",
        involved=ObjectRef(
            kind=io.kind or "", name=io.name or "", namespace=io.namespace or "",
            api_version=io.api_version or "", uid=io.uid or "",
        ),
        reason=ev.reason or "",
        message=ev.message or "",
        type=ev.type or "Normal",
        count=ev.count or 1,
    )


def import_api_classes() -> None:
    """Import the API classes KubeCluster builds. The kubernetes package imports each on first
    use (CoreV1Api alone: 1.6 s on a quiet core, its pydantic fields), so a prefork child paid it
    inside its first task: a sweep shard's 6 s soft time limit in the demo was exceeded under load
    (SoftTimeLimitExceeded from ``client.CoreV1Api``). A worker calls this before it forks."""
    for name in ("CoreV1Api", "CustomObjectsApi", "CoordinationV1Api"):
        getattr(client, name)


class KubeCluster:
    """``ClusterWriter`` (and so ``ClusterReader``) on the official client.

    Hand a read-only consumer this object typed as ``ClusterReader``; the type checker keeps it
    from writing.
    """

    def __init__(self, api_client: client.ApiClient, *, clock: Clock | None = None, component: str = "powerfleet",
                 dgd_version: str | None = None) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.clock = clock or SystemClock()
        self.component = component
        self._dgd_version = dgd_version  # None: discovered on first use (dgd_version())

    @classmethod
    def from_kubeconfig(cls, path: str, *, context: str | None = None, **kwargs: Any) -> KubeCluster:
        return cls(config.new_client_from_config(config_file=str(path), context=context), **kwargs)

    @classmethod
    def in_cluster(cls, **kwargs: Any) -> KubeCluster:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return cls(client.ApiClient(cfg), **kwargs)

    def close(self) -> None:
        self.api_client.close()

    # -- DGDs --

    def served_dgd_versions(self) -> list[str]:
        """The versions serving DGDs (API discovery), in DGD_VERSIONS order; each version's resource
        list is read too, as one may serve only the scaling adapter (tests/control_plane)."""
        with _api_errors("discover API groups"):
            groups = with_retries(lambda: client.ApisApi(self.api_client).get_api_versions(
                _request_timeout=REQUEST_TIMEOUT_SECONDS))
        served = {v.version for g in groups.groups or [] if g.name == DGD_GROUP for v in g.versions or []}
        return [v for v in DGD_VERSIONS if v in served and self._serves_dgds(v)]

    def _serves_dgds(self, version: str) -> bool:
        with _api_errors(f"discover {DGD_GROUP}/{version}"):
            listed = self.custom.get_api_resources(DGD_GROUP, version, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        return any(r.name == DGD_PLURAL for r in listed.resources or [])

    def dgd_version(self) -> str:
        """The DGD version this adapter reads and writes: v1beta1 when served, else v1alpha1."""
        if self._dgd_version is None:
            served = self.served_dgd_versions()
            if not served:
                raise NotFound(f"the cluster serves no {DGD_GROUP} DynamoGraphDeployment version "
                               f"({', '.join(DGD_VERSIONS)}); is the Dynamo operator installed?", status=404)
            self._dgd_version = served[0]
        return self._dgd_version

    def get_dgd_object(self, namespace: str, name: str) -> dict[str, Any]:
        with _api_errors(f"get DGD {namespace}/{name}"):
            return with_retries(lambda: self.custom.get_namespaced_custom_object(
                DGD_GROUP, self.dgd_version(), namespace, DGD_PLURAL, name, _request_timeout=REQUEST_TIMEOUT_SECONDS
            ))

    def get_dgd(self, namespace: str, name: str) -> DGD:
        return parse_dgd(self.get_dgd_object(namespace, name))

    def list_dgds(self, namespace: str | None = None) -> list[DGD | InvalidDGD]:
        with _api_errors(f"list DGDs in {namespace or 'all namespaces'}"):
            if namespace is None:
                listed = with_retries(lambda: self.custom.list_cluster_custom_object(
                    DGD_GROUP, self.dgd_version(), DGD_PLURAL,
                    timeout_seconds=LIST_TIMEOUT_SECONDS, _request_timeout=REQUEST_TIMEOUT_SECONDS,
                ))
            else:
                listed = with_retries(lambda: self.custom.list_namespaced_custom_object(
                    DGD_GROUP, self.dgd_version(), namespace, DGD_PLURAL,
                    timeout_seconds=LIST_TIMEOUT_SECONDS, _request_timeout=REQUEST_TIMEOUT_SECONDS,
                ))
        out: list[DGD | InvalidDGD] = []
        for item in listed.get("items", []):
            try:
                out.append(parse_dgd(item))
            except DGDInputError as exc:
                meta = item.get("metadata") or {}
                out.append(InvalidDGD(
                    namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                    uid=str(meta.get("uid", "")), path=exc.path, message=exc.message, component=exc.component,
                ))
        return out

    def patch_dgd_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource; returns the stored object."""
        with _api_errors(f"patch DGD status {namespace}/{name}"):
            return self.custom.patch_namespaced_custom_object_status(
                DGD_GROUP, self.dgd_version(), namespace, DGD_PLURAL, name, {"status": dict(status)},
                _request_timeout=REQUEST_TIMEOUT_SECONDS, _content_type=MERGE_PATCH,
            )

    def patch_dgd_replicas(
        self, namespace: str, name: str, replicas: Mapping[str, int], *, resource_version: str | None = None,
        current: DGD | None = None,
    ) -> DGD:
        """Write only the named components' replica counts (never a full update, so RBAC needs
        ``patch`` but not ``update`` on DGDs).

        The services map (v1alpha1) takes a merge patch. The components list (v1beta1) is a list a
        merge patch would replace whole, so it takes a JSON patch that replaces each replicas
        field by index, guarded by a ``test`` of the component's name there. ``resource_version``
        fences the write against what the caller read (stale -> Conflict). ``current``: the DGD the
        caller already read (saves a GET; its order locates the components).
        """
        if current is None:
            current = parse_dgd(self.get_dgd_object(namespace, name))  # refuses a malformed DGD first
        for comp, n in replicas.items():
            if current.component(comp) is None:
                raise NotFound(f"DGD {namespace}/{name} has no component {comp!r}")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"replicas for {comp!r} must be a non-negative integer, got {n!r}")
        body: Any
        if current.form == "services":
            body = {"spec": {"services": {comp: {"replicas": n} for comp, n in replicas.items()}}}
            if resource_version is not None:
                body["metadata"] = {"resourceVersion": resource_version}
            ctype = MERGE_PATCH
        else:
            body = [] if resource_version is None else [
                {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
            for i, c in enumerate(current.components):
                if c.name in replicas:
                    body.append({"op": "test", "path": f"/spec/components/{i}/name", "value": c.name})
                    body.append({"op": "add", "path": f"/spec/components/{i}/replicas", "value": replicas[c.name]})
            ctype = JSON_PATCH
        with _api_errors(f"patch DGD replicas {namespace}/{name}"):
            try:
                stored = self.custom.patch_namespaced_custom_object(
                    DGD_GROUP, self.dgd_version(), namespace, DGD_PLURAL, name, body,
                    _request_timeout=REQUEST_TIMEOUT_SECONDS, _content_type=ctype,
                )
            except ApiException as exc:
                # Only a failed test op is a conflict (the DGD changed since it was read); any other
                # 422 (schema, CEL rule, webhook) is Rejected with the server's message (patch_errors.py).
                tested = tuple(op["path"] for op in body if op.get("op") == "test") if isinstance(body, list) else ()
                raise_for_patch(f"patch DGD replicas {namespace}/{name}", exc, tested)
        return parse_dgd(stored)

    # -- nodes --

    def list_nodes(self, *, label_selector: str | None = None) -> list[NodeInfo]:
        """The nodes, read as JSON, not through the client's models: a real node carries its images
        and conditions, and at 10,000 nodes building V1Node models was the tick's largest read
        after the pods (bench/scale.py part r)."""
        with _api_errors(f"list nodes ({label_selector or ''})".strip()):
            resp = with_retries(lambda: self.core.list_node(
                label_selector=label_selector, timeout_seconds=LIST_TIMEOUT_SECONDS,
                _request_timeout=REQUEST_TIMEOUT_SECONDS, _preload_content=False))
            listed = json.loads(resp.data)
        out: list[NodeInfo] = []
        for n in (listed.get("items") or []) if isinstance(listed, dict) else []:
            meta, status = n.get("metadata") or {}, n.get("status") or {}
            out.append(NodeInfo(name=str(meta.get("name") or ""), labels=dict(meta.get("labels") or {}),
                                gpu_allocatable=gpu_allocatable(status.get("allocatable") or {})))
        return out

    # -- pods --

    def list_pods(
        self, namespace: str | None = None, *, label_selector: str | None = None, node_name: str | None = None
    ) -> list[PodInfo]:
        field_selector = f"spec.nodeName={node_name}" if node_name else None
        kwargs: dict[str, Any] = {
            "label_selector": label_selector, "field_selector": field_selector,
            "timeout_seconds": LIST_TIMEOUT_SECONDS, "_request_timeout": REQUEST_TIMEOUT_SECONDS,
        }
        with _api_errors(f"list pods ({label_selector or ''} {field_selector or ''})".strip()):
            if namespace is None:
                listed = with_retries(lambda: self.core.list_pod_for_all_namespaces(**kwargs))
            else:
                listed = with_retries(lambda: self.core.list_namespaced_pod(namespace, **kwargs))
        return [pod_info(p) for p in listed.items]

    def list_pods_with_version(
        self, namespace: str | None = None, *, node_name: str | None = None, resource_version: str | None = "0",
        request_timeout: float | tuple[float, float] = REQUEST_TIMEOUT_SECONDS,
    ) -> tuple[list[PodInfo], str]:
        """The pods and the list's resourceVersion, to watch from (the agent's pod view).
        ``resource_version="0"`` lets the API server answer from its cache."""
        kwargs: dict[str, Any] = {"timeout_seconds": LIST_TIMEOUT_SECONDS, "_request_timeout": request_timeout}
        if node_name:
            kwargs["field_selector"] = f"spec.nodeName={node_name}"
        if resource_version is not None:
            kwargs["resource_version"] = resource_version
        with _api_errors("list pods"):
            if namespace is None:
                listed = self.core.list_pod_for_all_namespaces(**kwargs)
            else:
                listed = self.core.list_namespaced_pod(namespace, **kwargs)
        return [pod_info(p) for p in listed.items], str(listed.metadata.resource_version or "")

    def watch_pods(
        self,
        namespace: str | None = None,
        *,
        node_name: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        timeout_seconds: int = 30,
        request_timeout: float | tuple[float, float] | None = None,
        bookmarks: bool = False,
    ) -> Iterator[PodEvent]:
        """Stream pod changes until ``timeout_seconds`` (server side) or until the caller stops.

        Without ``resource_version`` the stream starts with ADDED for every matching pod. A version
        the server no longer has raises ``ClusterError`` with ``status == 410``: re-list, then watch
        from the list's version. With ``bookmarks`` the server also sends BOOKMARK events (an empty
        ``pod``, the current ``resource_version``): a watch whose pods never change resumes from a
        version the server still holds.
        """
        kwargs: dict[str, Any] = {"timeout_seconds": timeout_seconds}
        if bookmarks:
            kwargs["allow_watch_bookmarks"] = True
        if node_name:
            kwargs["field_selector"] = f"spec.nodeName={node_name}"
        if label_selector:
            kwargs["label_selector"] = label_selector
        if resource_version:
            kwargs["resource_version"] = resource_version
        if request_timeout is not None:  # a client deadline: a server that stops sending cannot hold the watch
            kwargs["_request_timeout"] = request_timeout
        w = watch.Watch()
        try:
            with _api_errors("watch pods"):
                if namespace is None:
                    stream = w.stream(self.core.list_pod_for_all_namespaces, **kwargs)
                else:
                    stream = w.stream(self.core.list_namespaced_pod, namespace, **kwargs)
                for event in stream:
                    if event["type"] == "BOOKMARK":  # only metadata.resourceVersion: not a pod
                        version = str((event["raw_object"].get("metadata") or {}).get("resourceVersion") or "")
                        yield PodEvent(type="BOOKMARK", pod=PodInfo(name="", namespace=""), resource_version=version)
                        continue
                    pod = event["object"]
                    info = pod_info(pod)
                    yield PodEvent(type=event["type"], pod=info, resource_version=info.resource_version)
        finally:
            w.stop()

    # -- leases --

    def get_lease(self, namespace: str, name: str) -> Lease:
        with _api_errors(f"get lease {namespace}/{name}", LeaseConflict):
            return lease_info(self.coordination.read_namespaced_lease(name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS))

    def create_lease(self, lease: Lease) -> Lease:
        """Create; an existing Lease of that name -> LeaseConflict."""
        body = _lease_body(lease.model_copy(update={"resource_version": ""}))
        with _api_errors(f"create lease {lease.namespace}/{lease.name}", LeaseConflict):
            return lease_info(self.coordination.create_namespaced_lease(
                lease.namespace, body, _request_timeout=REQUEST_TIMEOUT_SECONDS))

    def update_lease(self, lease: Lease) -> Lease:
        """Replace, fenced on ``lease.resource_version``; a stale version -> LeaseConflict."""
        if not lease.resource_version:
            raise ValueError("update_lease needs the resource_version the caller read (no unconditional writes)")
        with _api_errors(f"update lease {lease.namespace}/{lease.name}", LeaseConflict):
            return lease_info(self.coordination.replace_namespaced_lease(
                lease.name, lease.namespace, _lease_body(lease), _request_timeout=REQUEST_TIMEOUT_SECONDS))

    def delete_lease(self, namespace: str, name: str, *, resource_version: str | None = None) -> None:
        """Delete, fenced on ``resource_version`` when given; a stale version -> LeaseConflict."""
        opts = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=resource_version) if resource_version else None
        )
        with _api_errors(f"delete lease {namespace}/{name}", LeaseConflict):
            self.coordination.delete_namespaced_lease(name, namespace, body=opts, _request_timeout=REQUEST_TIMEOUT_SECONDS)

    # -- events --

    def record_event(
        self, involved: ObjectRef, reason: str, message: str, *, type: Literal["Normal", "Warning"] = "Normal"
    ) -> EventInfo:
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{involved.name}.{uuid.uuid4().hex[:16]}", namespace=involved.namespace),
            involved_object=client.V1ObjectReference(
                kind=involved.kind, name=involved.name, namespace=involved.namespace,
                api_version=involved.api_version or None, uid=involved.uid or None,
            ),
            reason=reason,
            message=message,
            type=type,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=client.V1EventSource(component=self.component),
            reporting_component=self.component,
        )
        with _api_errors(f"record event {reason} on {involved.kind}/{involved.name}"):
            return event_info(self.core.create_namespaced_event(
                involved.namespace, body, _request_timeout=REQUEST_TIMEOUT_SECONDS))

    def list_events(self, namespace: str, *, involved_name: str | None = None) -> list[EventInfo]:
        selector = f"involvedObject.name={involved_name}" if involved_name else None
        with _api_errors(f"list events in {namespace}"):
            listed = self.core.list_namespaced_event(
                namespace, field_selector=selector, timeout_seconds=LIST_TIMEOUT_SECONDS,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        return [event_info(e) for e in listed.items]
