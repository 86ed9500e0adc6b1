"""Writing replica counts through whoever owns them, and noticing another writer (issue 18 item 6).

A component with a scaling adapter is scaled through the adapter's ``spec.replicas``; any other
through the DGD (a merge or JSON patch of the counts only). Each evaluation records the counts it
left (read, or written); a later evaluation that finds different counts it did not write has
found another writer, and from then on the deployment is reported, not scaled, unless
``budget.deployments.<key>.sole_writer`` is true (``budget.readmit`` clears the finding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from powerfleet.cluster.dgd import DGD
from powerfleet.cluster.ports import ClusterWriter
from powerfleet.cluster.scaling import ScalingAdapter


class ScalingPort(Protocol):
    def list_scaling_adapters(self, namespace: str) -> list[ScalingAdapter]: ...

    def patch_adapter_replicas(self, adapter: ScalingAdapter, replicas: int) -> None: ...


class NoAdapters:
    """A cluster without scaling adapters (or a caller that does not look)."""

    def list_scaling_adapters(self, namespace: str) -> list[ScalingAdapter]:
        return []

    def patch_adapter_replicas(self, adapter: ScalingAdapter, replicas: int) -> None:
        raise AssertionError("no adapter was listed")


@dataclass(frozen=True)
class Owners:
    adapters: dict[str, ScalingAdapter] = field(default_factory=dict)  # component -> its adapter

    def replicas(self) -> dict[str, int]:
        return {c: a.replicas for c, a in self.adapters.items() if a.replicas is not None}


def owners_of(scaling: ScalingPort, dgd: DGD) -> Owners:
    """This DGD's adapters, from one LIST of its namespace's (raises ClusterError)."""
    return Owners({a.component: a for a in scaling.list_scaling_adapters(dgd.namespace) if a.dgd == dgd.name})


def owned_counts(dgd: DGD, owners: Owners, components: Iterable[str]) -> dict[str, int]:
    """The replica counts their owners hold now: the adapter's where there is one, else the DGD's."""
    held = owners.replicas()
    return {c: held.get(c, comp.replicas) for c in components if (comp := dgd.component(c)) is not None}


def other_writer(last: Mapping[str, int] | None, now: Mapping[str, int]) -> str | None:
    """Why the counts look written by someone else since the last evaluation (None: they do not)."""
    if last is None:
        return None
    moved = [f"{c} {last[c]} -> {n}" for c, n in sorted(now.items()) if c in last and last[c] != n]
    return f"replicas changed by another writer since the last evaluation ({', '.join(moved)})" if moved else None


class PartialWrite(Exception):
    """Some counts were written before a later write failed (``cause``, a ClusterError such as a
    409 on the DGD after an adapter's patch landed): ``written`` is what landed, to be recorded as
    powerfleet's own, so it never reads as another writer's."""

    def __init__(self, written: Mapping[str, int], cause: Exception) -> None:
        super().__init__(f"wrote {dict(written)}, then: {cause}")
        self.written, self.cause = dict(written), cause


def write_replicas(cluster: ClusterWriter, scaling: ScalingPort, dgd: DGD, owners: Owners,
                   replicas: Mapping[str, int]) -> tuple[dict[str, int], str | None]:
    """Write each count through its owner; returns the counts that changed and the DGD's new
    resourceVersion (None: the DGD was not patched). Raises Conflict (the object changed since it
    was read), Rejected (refused by the server) or ClusterError, wrapped in PartialWrite when an
    adapter's count was written before it."""
    held = owned_counts(dgd, owners, replicas)
    changed = {c: n for c, n in replicas.items() if held.get(c) != n}
    through_dgd = {c: n for c, n in changed.items() if c not in owners.adapters}
    written: dict[str, int] = {}
    version = None
    try:
        for c, n in changed.items():
            if c in owners.adapters:
                scaling.patch_adapter_replicas(owners.adapters[c], n)
                written[c] = n
        if through_dgd:
            version = cluster.patch_dgd_replicas(dgd.namespace, dgd.name, through_dgd,
                                                 resource_version=dgd.resource_version, current=dgd).resource_version
    except Exception as exc:
        if written:
            raise PartialWrite(written, exc) from exc
        raise
    return changed, version
