"""The REST verbs: GET/LIST/WATCH, POST, PUT, PATCH, DELETE and deletecollection on a routed resource."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

from powerfleet.twin.apiserver.errors import ApiError
from powerfleet.twin.apiserver.http import Handler
from powerfleet.twin.apiserver.patches import json_patch, merge_patch
from powerfleet.twin.apiserver.options import ServerOptions
from powerfleet.twin.apiserver.resources import Registry, ResourceType
from powerfleet.twin.apiserver.routing import Route, route
from powerfleet.twin.apiserver.selectors import parse_field_selector, parse_label_selector
from powerfleet.twin.apiserver.store import Store
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


def handle(store: Store, registry: Registry, stopping: threading.Event, req: Handler, method: str,
           options: ServerOptions) -> None:
    split = urlsplit(req.path)
    query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
    found = route(split.path, registry)
    if not isinstance(found, Route):
        if method != "GET":
            raise ApiError(405, "MethodNotAllowed", "method not allowed")
        req.send_json(200, found)
        return
    rt, ns, name = found.rt, found.namespace or "", found.name
    if method == "GET" and name is None:
        label = parse_label_selector(query.get("labelSelector", ""))
        field = parse_field_selector(query.get("fieldSelector", ""))
        if query.get("watch") in ("true", "1"):
            watch(store, stopping, req, rt, found.namespace, label, field, query)
            return
        items, rv = store.list(rt, found.namespace, label, field)
        req.send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(rv)}, "items": items})
        return
    if method == "GET":
        req.send_json(200, store.get(rt, ns, name))
        return
    body = req.json_body()
    if method == "POST" and name is None:
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "expected an object body")
        req.send_json(201, store.create(rt, ns, dict(body), keep_status=False))
        return
    if method == "DELETE" and name is None:
        label = parse_label_selector(query.get("labelSelector", ""))
        field = parse_field_selector(query.get("fieldSelector", ""))
        items, _ = store.list(rt, found.namespace, label, field)
        for it in items:
            store.delete(rt, it["metadata"].get("namespace", ""), it["metadata"]["name"])
        req.send_json(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(store.rv)}, "items": items})
        return
    if name is None:
        raise ApiError(405, "MethodNotAllowed", f"{method} needs an object name")
    if method == "PUT":
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "expected an object body")
        require = rt.group not in ("", "coordination.k8s.io", "events.k8s.io") and found.subresource is None
        req.send_json(200, store.replace(rt, ns, name, dict(body), subresource=found.subresource, require_rv=require))
        return
    if method == "PATCH":
        ctype = (req.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype.startswith("application/apply-patch"):
            raise ApiError(415, "UnsupportedMediaType", "server-side apply is not implemented by the loopback server")
        with store.cond:
            current = store.get(rt, ns, name)
            if isinstance(body, list):
                patched = json_patch(current, body)
            elif isinstance(body, Mapping):
                patched = merge_patch(current, body)
            else:
                raise ApiError(400, "BadRequest", "expected a patch body")
            if not isinstance(body, Mapping) or "resourceVersion" not in (body.get("metadata") or {}):
                patched.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            result = store.replace(rt, ns, name, patched, subresource=found.subresource, require_rv=False)
        req.send_json(200, result)
        return
    if method == "DELETE":
        pre = body.get("preconditions") if isinstance(body, Mapping) else None
        grace = _pod_grace(store, rt, ns, name, query, body) if options.graceful_pod_deletion else None
        if grace:
            store.check_preconditions(rt, ns, name, pre)
            req.send_json(200, store.mark_deleting(rt, ns, name, grace))
            return
        old = store.delete(rt, ns, name, pre)
        if rt.delete_returns_object:
            req.send_json(200, old)
        else:
            req.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": rt.group, "kind": rt.plural,
                                        "uid": old["metadata"]["uid"]}})
        return
    raise ApiError(405, "MethodNotAllowed", f"method {method} not allowed")
