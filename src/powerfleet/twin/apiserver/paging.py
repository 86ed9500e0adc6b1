"""LIST pagination (``limit`` and ``continue``) as kube-apiserver pages: items in key order
(namespace, name), an opaque continue token naming where the next page starts, and
``remainingItemCount`` while more items follow (none under a selector, as the real server says).
Unlike the real server, a continued list reads the current objects, not a snapshot at the first
page's resourceVersion (docs/twin.md)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

from powerfleet.twin.apiserver.errors import ApiError, Obj


def _key(obj: Obj) -> tuple[str, str]:  # the store's order
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _start_after(token: str) -> tuple[tuple[str, str], int]:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
        ns, name = decoded["start"]
        return (str(ns), str(name)), int(decoded["rv"])
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, "BadRequest", f"continue key is not valid: {exc}") from None


def paginate(items: list[Obj], rv: int, query: Mapping[str, str]) -> tuple[list[Obj], dict[str, object]]:
    """The page of ``items`` (sorted by key) the query asks for, and the list metadata to send."""
    meta: dict[str, object] = {"resourceVersion": str(rv)}
    token = query.get("continue") or ""
    if token:
        start, first_rv = _start_after(token)
        items = [i for i in items if _key(i) > start]
        meta["resourceVersion"] = str(first_rv)
    raw = query.get("limit") or "0"
    try:
        limit = int(raw)
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid limit {raw!r}") from None
    if limit <= 0 or len(items) <= limit:
        return items, meta
    page = items[:limit]
    cont = {"v": "meta.k8s.io/v1", "rv": int(str(meta["resourceVersion"])), "start": list(_key(page[-1]))}
    meta["continue"] = base64.urlsafe_b64encode(json.dumps(cont).encode()).decode().rstrip("=")
    if not (query.get("labelSelector") or query.get("fieldSelector")):  # unknown under a selector
        meta["remainingItemCount"] = len(items) - limit
    return page, meta
