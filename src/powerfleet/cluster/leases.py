"""Leases through the official client: the narrow port retune's leadership and state use.

``KubeCluster`` (cluster/kube.py) already performs the four calls on ``CoordinationV1Api``
(get; create; update fenced on ``resourceVersion``; delete with a ``resourceVersion``
precondition), mapping 404 to ``NotFound`` and 409 to ``LeaseConflict``. This module names
that capability as its own Protocol so retune code can be handed *only* Leases, and builds
the client from a kubeconfig or the in-cluster service account.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.objects import Lease
from powerfleet.cluster.ports import LeaseConflict, NotFound

__all__ = ["LeasePort", "LeaseConflict", "NotFound", "Lease", "connect"]


@runtime_checkable
class LeasePort(Protocol):
    def get_lease(self, namespace: str, name: str) -> Lease: ...

    def create_lease(self, lease: Lease) -> Lease: ...

    def update_lease(self, lease: Lease) -> Lease: ...

    def delete_lease(self, namespace: str, name: str, *, resource_version: str | None = None) -> None: ...


def connect(kubeconfig: str | None) -> KubeCluster:
    """A cluster client: from ``kubeconfig`` when given, else the in-cluster service account."""
    if kubeconfig:
        return KubeCluster.from_kubeconfig(kubeconfig, component="powerfleet-retune")
    return KubeCluster.in_cluster(component="powerfleet-retune")
