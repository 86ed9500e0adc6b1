"""URL routing: a request path to a resource route, or to a discovery document."""

from __future__ import annotations

from dataclasses import dataclass

from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.resources import Registry, ResourceType


@dataclass(frozen=True)
class Route:
    rt: ResourceType
    namespace: str | None  # None: all namespaces (or cluster-scoped)
    name: str | None
    subresource: str | None


def discovery(parts: list[str], registry: Registry) -> Obj | None:
    """The discovery document for ``/version``, ``/api`` and ``/apis``; None for any other path."""
    if parts in (["version"], ["version", ""]):
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-powerfleet-loopback", "platform": "fixture"}
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if parts == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [_api_group(g, registry) for g in sorted({rt.group for rt in registry if rt.group})]}
    if len(parts) == 2 and parts[0] == "apis" and any(rt.group == parts[1] for rt in registry):
        return _api_group(parts[1], registry)
    if len(parts) == 3 and parts[0] == "apis" or len(parts) == 2 and parts[0] == "api":
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        served = [rt for rt in registry if (rt.group, rt.version) == (group, version)]
        if served:
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": served[0].api_version,
                    "resources": [r for rt in served for r in _resources(rt)]}
    return None


def _api_group(group: str, registry: Registry) -> Obj:
    """One APIGroup: its versions in registration order; the first is preferred."""
    versions: list[str] = []
    for rt in registry:
        if rt.group == group and rt.version not in versions:
            versions.append(rt.version)
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries, "preferredVersion": entries[0]}


def _resources(rt: ResourceType) -> list[Obj]:
    verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    out: list[Obj] = [{"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
                       "kind": rt.kind, "verbs": verbs}]
    if rt.status_subresource:
        out.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                    "kind": rt.kind, "verbs": ["get", "patch", "update"]})
    return out


def route(path: str, registry: Registry) -> Route | Obj:
    """Resolve a URL path; raises ApiError(404) for anything not served."""
    parts = [p for p in path.split("/") if p]
    doc = discovery(parts, registry)
    if doc is not None:
        return doc
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    rt = registry.lookup(group, version, rest[0])
    if rt is None:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    if rt.namespaced and namespace is None and len(rest) > 1:
        raise ApiError(404, "NotFound", f"{rt.plural} is namespaced ({path})")
    if not rt.namespaced and namespace is not None:
        raise ApiError(404, "NotFound", f"{rt.plural} is cluster-scoped ({path})")
    sub = rest[2] if len(rest) == 3 else None
    if sub is not None and not ((sub == "status" and rt.status_subresource) or (sub == "binding" and rt.kind == "Pod")):
        raise ApiError(404, "NotFound", f"no subresource {sub!r} on {rt.plural}")
    return Route(rt, namespace if rt.namespaced else None, rest[1] if len(rest) > 1 else None, sub)

