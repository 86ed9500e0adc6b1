"""Ports: what powerfleet needs from a Kubernetes cluster, as narrow Protocols.

``ClusterReader`` cannot write: hand it to code that must only observe (the agent's pod
listing, settlement, immutability checks). ``ClusterWriter`` adds the few writes powerfleet
makes. ``powerfleet.cluster.kube.KubeCluster`` implements both on the official client.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from powerfleet.cluster.dgd import DGD
from powerfleet.cluster.objects import EventInfo, Lease, NodeInfo, ObjectRef, PodInfo


class ClusterError(Exception):
    """A cluster call failed (transport error or an unexpected API status)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(ClusterError):
    """404: the object does not exist."""


class Conflict(ClusterError):
    """409: a stale resourceVersion (or the object already exists). A stale write never wins."""


class LeaseConflict(Conflict):
    """409 on a Lease create/update/delete."""


@dataclass(frozen=True)
class InvalidDGD:
    """A DGD in a list that could not be parsed; the caller fails closed for it alone."""

    namespace: str
    name: str
    uid: str
    path: str
    message: str
    component: str = ""


@dataclass(frozen=True)
class PodEvent:
    """One change seen by a pod watch."""

    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    pod: PodInfo
    resource_version: str


@runtime_checkable
class ClusterReader(Protocol):
    def get_dgd(self, namespace: str, name: str) -> DGD: ...

    def get_dgd_object(self, namespace: str, name: str) -> dict[str, Any]: ...

    def list_dgds(self, namespace: str | None = None) -> list[DGD | InvalidDGD]: ...

    def list_pods(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        node_name: str | None = None,
    ) -> list[PodInfo]: ...

    def watch_pods(
        self,
        namespace: str | None = None,
        *,
        node_name: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        timeout_seconds: int = 30,
        bookmarks: bool = False,
    ) -> Iterator[PodEvent]: ...

    def list_nodes(self, *, label_selector: str | None = None) -> list[NodeInfo]: ...

    def get_lease(self, namespace: str, name: str) -> Lease: ...

    def list_events(self, namespace: str, *, involved_name: str | None = None) -> list[EventInfo]: ...


@runtime_checkable
class ClusterWriter(ClusterReader, Protocol):
    def patch_dgd_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]: ...

    def patch_dgd_replicas(
        self, namespace: str, name: str, replicas: Mapping[str, int], *, resource_version: str | None = None,
        current: DGD | None = None,
    ) -> DGD: ...

    def create_lease(self, lease: Lease) -> Lease: ...

    def update_lease(self, lease: Lease) -> Lease: ...

    def delete_lease(self, namespace: str, name: str, *, resource_version: str | None = None) -> None: ...

    def record_event(
        self, involved: ObjectRef, reason: str, message: str, *, type: Literal["Normal", "Warning"] = "Normal"
    ) -> EventInfo: ...
