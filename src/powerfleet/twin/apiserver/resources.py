"""The resource registry: which (group, version, plural) the server serves, and their kinds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    delete_returns_object: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


def _custom(plural: str, kind: str, versions: tuple[str, ...]) -> tuple[ResourceType, ...]:
    return tuple(ResourceType("nvidia.com", v, plural, kind, status_subresource=True, delete_returns_object=True)
                 for v in versions)


DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "pods", "Pod", status_subresource=True, delete_returns_object=True),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, status_subresource=True),
    ResourceType("", "v1", "events", "Event"),
    # The budget keeps its status in one ConfigMap per deployment (cluster/budget_store.py).
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("events.k8s.io", "v1", "events", "Event"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    # Both versions of each custom resource share one store (the key is group + plural), kept in
    # the CRD's storage version and converted for each reader (conversion.py); the first listed
    # is the preferred version in discovery.
    *_custom("dynamographdeployments", "DynamoGraphDeployment", ("v1beta1", "v1alpha1")),
    *_custom("dynamographdeploymentscalingadapters", "DynamoGraphDeploymentScalingAdapter", ("v1beta1", "v1alpha1")),
)


class Registry:
    """The served resource types, looked up by URL path parts or by an object's apiVersion/kind."""

    def __init__(self, resources: Iterable[ResourceType] = DEFAULT_RESOURCES) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rt in resources:
            self.register(rt)

    def register(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def of_object(self, obj: Mapping[str, Any]) -> ResourceType:
        """The type of an object from its ``apiVersion`` and ``kind``; ValueError if not served."""
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise ValueError(f"unknown apiVersion/kind {api_version}/{kind}")

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._types.values()))
