"""WATCH: chunked JSON lines from the store's event log, resumable while the version is still logged (else 410);
BOOKMARK events when the client allows them; a watch list (``sendInitialEvents``) as kube-apiserver serves one."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping

from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.http import Handler
from powerfleet.twin.apiserver.resources import ResourceType
from powerfleet.twin.apiserver.store import Store


BOOKMARK_EVERY_S = 60.0
BOOKMARK_BEFORE_DEADLINE_S = 2.0
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def bookmark_time(now: float, deadline: float) -> float:
    """When the next BOOKMARK may go out, as kube-apiserver's watch cache schedules them (with
    ``allowWatchBookmarks``): every minute, and 2 s before the watch's deadline. One is sent only
    when the store has moved past what the watcher was last sent (writes its selectors filter out)."""
    last_one = deadline - BOOKMARK_BEFORE_DEADLINE_S
    return min(now + BOOKMARK_EVERY_S, last_one) if now < last_one else float("inf")


def initial_events(query: Mapping[str, str]) -> bool | None:
    """``sendInitialEvents`` (None when not given): true makes the watch a watch list (the state now
    as ADDED events, then, with bookmarks, a BOOKMARK annotated ``k8s.io/initial-events-end`` at the
    store's version). The real server's option checks come first (apimachinery's
    validateWatchOptions), as a 422 on ``ListOptions`` naming the field."""
    send, match = query.get("sendInitialEvents"), query.get("resourceVersionMatch")
    causes: list[tuple[str, str, str]] = []
    if send is not None and match != "NotOlderThan":
        causes.append(("FieldValueForbidden", "resourceVersionMatch",
                       "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
    if match and send is None:
        causes.append(("FieldValueForbidden", "resourceVersionMatch",
                       "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"))
    if match and match != "NotOlderThan":
        causes.append(("FieldValueNotSupported", "resourceVersionMatch",
                       f'Unsupported value: "{match}": supported values: "NotOlderThan"'))
    if causes:
        text = ", ".join(f"{path}: {msg}" for _, path, msg in causes)
        raise ApiError(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {text}', {
            "group": "meta.k8s.io", "kind": "ListOptions",
            "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]})
    return None if send is None else send in ("true", "1")


def watch(store: Store, stopping: threading.Event, req: Handler, rt: ResourceType, ns: str | None,
          label: Callable[..., bool], field: Callable[..., bool], query: Mapping[str, str],
          served: Callable[[Obj], Obj] = lambda o: o) -> None:
    initial = initial_events(query)
    bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
    timeout = float(query.get("timeoutSeconds") or 1800)
    # The watch timeout is wall-clock, independent of the injected clock.
    deadline = time.monotonic() + timeout
    req.send_response(200)
    req.send_header("Content-Type", "application/json")
    req.send_header("Transfer-Encoding", "chunked")
    req.end_headers()

    def emit(event: Obj) -> None:
        if event.get("type") not in ("ERROR", "BOOKMARK"):
            event = {**event, "object": served(event["object"])}
        data = json.dumps(event).encode() + b"\n"
        req.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        req.wfile.flush()

    def matches(obj: Obj) -> bool:
        return ((ns is None or obj["metadata"].get("namespace") == ns)
                and label(obj["metadata"].get("labels") or {}) and field(obj))

    rv_param = query.get("resourceVersion") or ""
    pending: list[Obj] = []
    with store.cond:
        if initial or (initial is None and rv_param in ("", "0")):  # a watch list: the state now
            last = store.rv
            items, _ = store.list(rt, ns, label, field)
            pending = [{"type": "ADDED", "object": o} for o in items]
            if initial and bookmarks:
                pending.append({"type": "BOOKMARK", "object": {
                    "kind": rt.kind, "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(last), "annotations": {INITIAL_EVENTS_END: "true"}}}})
        elif rv_param in ("", "0"):  # sendInitialEvents=false: from now on
            last = store.rv
        else:
            try:
                last = int(rv_param)
            except ValueError:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_param!r}") from None
            oldest = store.log[0][0] if store.log else store.rv + 1
            if last < oldest - 1 and last < store.rv:
                pending = [{"type": "ERROR", "object": ApiError(
                    410, "Expired", f"too old resource version: {last} ({oldest - 1})").status()}]
                last = -1
    next_bookmark = bookmark_time(time.monotonic(), deadline)
    sent = last  # the newest version this watcher was told of (an event or a bookmark)
    try:
        for ev in pending:
            emit(ev)
        while last >= 0 and not stopping.is_set():
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                break
            if bookmarks and now >= next_bookmark:
                if last > sent:  # as the watch cache: only a version the watcher has not reached
                    emit({"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version,
                                                         "metadata": {"resourceVersion": str(last)}}})
                    sent = last
                next_bookmark = bookmark_time(now, deadline)
            wait = min(remaining, 1.0, max(next_bookmark - now, 0.01) if bookmarks else 1.0)
            with store.cond:
                store.cond.wait_for(lambda: store.rv > last or stopping.is_set(), timeout=wait)
                fresh = [(rv, t, o) for rv, t, key, o in store.log if rv > last and key == rt.key]
                last = store.rv
            for rv, typ, obj in fresh:
                if matches(obj):
                    emit({"type": typ, "object": obj})
                    sent = rv
        req.wfile.write(b"0\r\n\r\n")
        req.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass
    req.close_connection = True
