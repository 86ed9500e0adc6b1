"""Patch rules by content type, as a real server has them (docs/cluster.md):

* ``application/merge-patch+json``: RFC 7386 merge patch (a list is replaced whole);
* ``application/json-patch+json``: RFC 6902 JSON patch (add, remove, replace, test), a list body;
* ``application/strategic-merge-patch+json``: built-in kinds only, applied here as a merge patch
  (the twin does not know the patch strategies of lists); a custom resource answers 415;
* ``application/apply-patch+yaml`` (server-side apply): 415 (not implemented).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from powerfleet.twin.apiserver.errors import ApiError


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


MERGE, JSON_PATCH, STRATEGIC = ("application/merge-patch+json", "application/json-patch+json",
                                "application/strategic-merge-patch+json")


def apply_patch(rt: Any, current: Any, body: Any, content_type: str) -> Any:
    """``current`` with ``body`` applied under ``content_type``; raises ApiError as a server would."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype.startswith("application/apply-patch"):
        raise ApiError(415, "UnsupportedMediaType", "server-side apply is not implemented by the loopback server")
    if ctype == STRATEGIC and rt.group not in ("", "coordination.k8s.io", "events.k8s.io"):
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media types include: "
                       f"{JSON_PATCH}, {MERGE}, application/apply-patch+yaml")
    if ctype == JSON_PATCH:
        if not isinstance(body, list):
            raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type []jsonpatch.Operation")
        return json_patch(current, body)
    if ctype in (MERGE, STRATEGIC):
        if not isinstance(body, Mapping):
            raise ApiError(400, "BadRequest", "a merge patch body must be a JSON object")
        return merge_patch(current, body)
    raise ApiError(415, "UnsupportedMediaType", f"unsupported patch content type {content_type!r}")


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, Mapping) or "op" not in op or "path" not in op:
            raise ApiError(422, "Invalid", f"bad JSON patch operation {op!r}")
        parts = _pointer(op["path"])
        if not parts:
            raise ApiError(422, "Invalid", "JSON patch on the whole document is not supported")
        parent: Any = doc
        for p in parts[:-1]:
            try:
                parent = parent[int(p)] if isinstance(parent, list) else parent.get(p) if isinstance(parent, dict) else None
            except (IndexError, ValueError):
                parent = None
            if parent is None:
                # A ``test`` of a missing path fails as a test (evanphx/json-patch: "test operation
                # does not apply"), which a client reads as "changed since it was read".
                what = "test operation does not apply: " if op["op"] == "test" else ""
                raise ApiError(422, "Invalid", f"{what}path {op['path']!r} does not exist")
        last = parts[-1]
        kind = op["op"]
        try:
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(idx, op.get("value"))
                elif kind == "remove":
                    parent.pop(idx)
                elif kind == "replace":
                    parent[idx] = op.get("value")
                elif kind == "test":
                    if parent[idx] != op.get("value"):
                        raise ApiError(422, "Invalid", f"test failed at {op['path']!r}")
                else:
                    raise ApiError(422, "Invalid", f"unsupported JSON patch op {kind!r}")
            else:
                if kind == "add":
                    parent[last] = op.get("value")
                elif kind == "remove":
                    del parent[last]
                elif kind == "replace":
                    if last not in parent:
                        raise KeyError(last)
                    parent[last] = op.get("value")
                elif kind == "test":
                    if parent.get(last) != op.get("value"):
                        raise ApiError(422, "Invalid", f"test failed at {op['path']!r}")
                else:
                    raise ApiError(422, "Invalid", f"unsupported JSON patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            if kind == "test":
                raise ApiError(422, "Invalid", f"test failed at {op['path']!r}: it does not exist") from None
            raise ApiError(422, "Invalid", f"cannot {kind} at {op['path']!r}") from None
    return doc
