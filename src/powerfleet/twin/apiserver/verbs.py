"""The REST verbs: GET/LIST/WATCH, POST, PUT, PATCH, DELETE and deletecollection on a routed resource."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from powerfleet.twin.apiserver.admission import admit, warning_header
from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.http import Handler
from powerfleet.twin.apiserver.pages import Pages, parse_limit
from powerfleet.twin.apiserver.patches import apply_patch
from powerfleet.twin.apiserver.options import ServerOptions
from powerfleet.twin.apiserver.resources import Registry, ResourceType
from powerfleet.twin.apiserver.routing import Route, route
from powerfleet.twin.apiserver.selectors import parse_field_selector, parse_label_selector
from powerfleet.twin.apiserver.store import Store
from powerfleet.twin.apiserver.versions import Versions
from powerfleet.twin.apiserver.watch import watch


_DEFAULT_GRACE_S = 30


def _pod_grace(store: Store, rt: ResourceType, ns: str, name: str, query: Mapping[str, str], body: object) -> int:
    """The grace period of a pod delete; 0 (remove now) for other kinds and unscheduled pods."""
    if (rt.group, rt.kind) != ("", "Pod"):
        return 0
    pod = store.get(rt, ns, name)
    if not (pod.get("spec") or {}).get("nodeName"):
        return 0  # never started: nothing to stop
    raw: object = query.get("gracePeriodSeconds")
    if raw is None and isinstance(body, Mapping):
        raw = body.get("gracePeriodSeconds")
    if raw is None:
        raw = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", _DEFAULT_GRACE_S)
    try:
        return max(0, int(str(raw)))
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid gracePeriodSeconds {raw!r}") from None


def bind(store: Store, rt: ResourceType, ns: str, name: str, body: object) -> None:
    """``pods/<name>/binding`` as the scheduler binds: the pod's node set once (409 when it has one),
    with its ``PodScheduled`` condition True; a pod's spec is otherwise not the client's to move."""
    target = body.get("target") if isinstance(body, Mapping) else None
    node = target.get("name") if isinstance(target, Mapping) and target.get("kind", "Node") == "Node" else None
    if not node:
        raise ApiError(400, "BadRequest", "a binding needs a target of kind Node with a name")
    with store.cond:
        pod = store.get(rt, ns, name)
        held = (pod.get("spec") or {}).get("nodeName")
        if held:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} '
                           f'is already assigned to node "{held}"', {"name": name, "kind": "pods/binding"})
        pod.setdefault("spec", {})["nodeName"] = str(node)
        status = pod.setdefault("status", {})
        status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"] + [
            {"type": "PodScheduled", "status": "True"}]
        pod["metadata"].pop("resourceVersion", None)
        store.replace(rt, ns, name, pod, subresource=None, require_rv=False, raw=True)


def handle(store: Store, registry: Registry, stopping: threading.Event, req: Handler, method: str,
           options: ServerOptions, pages: Pages | None = None) -> None:
    split = urlsplit(req.path)
    query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
    found = route(split.path, registry)
    if not isinstance(found, Route):
        if method != "GET":
            raise ApiError(405, "MethodNotAllowed", "method not allowed")
        req.send_json(200, found)
        return
    rt, ns, name = found.rt, found.namespace or "", found.name
    # Objects live in the storage version; each request sees them in its own (conversion.py).
    versions = Versions.of(rt, registry, enabled=options.convert)
    srt = versions.storage_rt
    if method == "GET" and name is None:
        label = parse_label_selector(query.get("labelSelector", ""))
        field = parse_field_selector(query.get("fieldSelector", ""))
        if query.get("watch") in ("true", "1"):
            watch(store, stopping, req, rt, found.namespace, label, field, query, versions.served)
            return
        limit, token = parse_limit(query.get("limit")), query.get("continue") or None
        if token and pages is None:
            raise ApiError(400, "BadRequest", "continue is not served here")
        items, rv = ([], 0) if token else store.list(srt, found.namespace, label, field)
        served = [versions.served(i) for i in items]
        selected = bool(query.get("labelSelector") or query.get("fieldSelector"))
        page, meta = ((served, {"resourceVersion": str(rv)}) if pages is None
                      else pages.page(served, rv, limit, token, selected))
        req.send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": page})
        return
    if method == "GET":
        req.send_json(200, versions.served(store.get(srt, ns, name)))
        return
    body = req.json_body()
    warnings: list[str] = []

    def admitted(obj: Mapping[str, Any], subresource: str | None) -> Obj:
        out, warned = admit(rt, dict(obj), subresource=subresource,
                            field_validation=query.get("fieldValidation", "Warn"), options=options)
        warnings.extend(warned)
        return out

    def reply(code: int, obj: Obj) -> None:
        req.send_json(code, versions.served(obj), [("Warning", warning_header(w)) for w in warnings])

    if method == "POST" and name is None:
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "expected an object body")
        reply(201, store.create(srt, ns, versions.stored(admitted(body, None), None), keep_status=False))
        return
    if method == "DELETE" and name is None:
        label = parse_label_selector(query.get("labelSelector", ""))
        field = parse_field_selector(query.get("fieldSelector", ""))
        items, _ = store.list(srt, found.namespace, label, field)
        for it in items:
            store.delete(srt, it["metadata"].get("namespace", ""), it["metadata"]["name"])
        req.send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(store.rv)}, "items": [versions.served(i) for i in items]})
        return
    if name is None:
        raise ApiError(405, "MethodNotAllowed", f"{method} needs an object name")
    if found.subresource == "binding":
        if method != "POST":
            raise ApiError(405, "MethodNotAllowed", f"method {method} not allowed on pods/binding")
        bind(store, srt, ns, name, body)
        req.send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
        return
    if method == "PUT":
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "expected an object body")
        require = rt.group not in ("", "coordination.k8s.io", "events.k8s.io") and found.subresource is None
        with store.cond:
            new = versions.stored(admitted(body, found.subresource), store.get(srt, ns, name))
            reply(200, store.replace(srt, ns, name, new, subresource=found.subresource, require_rv=require))
        return
    if method == "PATCH":
        with store.cond:
            previous = store.get(srt, ns, name)
            current = versions.served(previous)
            patched = apply_patch(rt, current, body, req.headers.get("Content-Type") or "")
            if not isinstance(body, Mapping) or "resourceVersion" not in (body.get("metadata") or {}):
                patched.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            new = versions.stored(admitted(patched, found.subresource), previous)
            result = store.replace(srt, ns, name, new, subresource=found.subresource, require_rv=False)
        reply(200, result)
        return
    if method == "DELETE":
        pre = body.get("preconditions") if isinstance(body, Mapping) else None
        grace = _pod_grace(store, rt, ns, name, query, body) if options.graceful_pod_deletion else None
        if grace:
            store.check_preconditions(rt, ns, name, pre)
            req.send_json(200, store.mark_deleting(rt, ns, name, grace))
            return
        old = store.delete(srt, ns, name, pre)
        if rt.delete_returns_object:
            req.send_json(200, versions.served(old))
        else:
            req.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": rt.group, "kind": rt.plural,
                                        "uid": old["metadata"]["uid"]}})
        return
    raise ApiError(405, "MethodNotAllowed", f"method {method} not allowed")
