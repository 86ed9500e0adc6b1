"""One resource type as a request sees it: the version it is served in, and the storage version
its objects are kept in (``conversion.py`` converts between them; docs/cluster.md)."""

from __future__ import annotations

from dataclasses import dataclass

from powerfleet.twin.apiserver.conversion import convert
from powerfleet.twin.apiserver.crds import crd_of
from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.resources import Registry, ResourceType


@dataclass(frozen=True)
class Versions:
    served_rt: ResourceType
    storage_rt: ResourceType  # == served_rt when the kind is not converted
    checked: bool = False  # a custom resource with conversion on: a body must name the endpoint's version

    @classmethod
    def of(cls, rt: ResourceType, registry: Registry, *, enabled: bool) -> Versions:
        crd = crd_of(rt) if enabled else None
        storage = registry.lookup(rt.group, crd.storage, rt.plural) if crd is not None else None
        return cls(rt, storage or rt, checked=crd is not None)

    @property
    def converting(self) -> bool:
        return self.storage_rt is not self.served_rt

    def served(self, obj: Obj) -> Obj:
        return convert(self.served_rt.key, obj, self.served_rt.version) if self.converting else obj

    def stored(self, obj: Obj, previous: Obj | None) -> Obj:
        if not self.checked:
            return obj
        given = obj.get("apiVersion")
        if given not in (None, "", self.served_rt.api_version):
            raise ApiError(400, "BadRequest", f"the API version in the data ({given}) does not match the expected "
                                              f"API version ({self.served_rt.api_version})")
        obj = {**obj, "apiVersion": self.served_rt.api_version}
        if not self.converting:
            return obj
        return convert(self.storage_rt.key, obj, self.storage_rt.version, previous=previous)
