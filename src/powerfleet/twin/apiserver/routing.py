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
        groups = sorted({(rt.group, rt.version) for rt in registry if rt.group})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
             "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]}
    return None


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
    if sub is not None and not (sub == "status" and rt.status_subresource):
        raise ApiError(404, "NotFound", f"no subresource {sub!r} on {rt.plural}")
    return Route(rt, namespace if rt.namespaced else None, rest[1] if len(rest) > 1 else None, sub)

