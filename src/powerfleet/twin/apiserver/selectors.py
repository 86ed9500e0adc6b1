"""Label and field selectors, compiled to predicates (the ``?labelSelector=`` / ``?fieldSelector=`` of LIST and WATCH)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from powerfleet.twin.apiserver.errors import ApiError

_LABEL_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9./_-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_LABEL_EQ_RE = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """Compile a label selector. Raises ApiError(400) when it cannot be parsed."""
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for req in _split_top_level(text or ""):
        m = _LABEL_EQ_RE.match(req)
        if m:
            key, op, val = m.groups()
            if op == "!=":
                tests.append(lambda labels, k=key, v=val: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=val: labels.get(k) == v)
            continue
        m = _LABEL_SET_RE.match(req)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {req!r}")
        neg, key, op, values = m.groups()
        if op and neg:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {req!r}")
        if op:
            vals = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                tests.append(lambda labels, k=key, vs=vals: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=vals: labels.get(k) not in vs)
        elif neg:
            tests.append(lambda labels, k=key: k not in labels)
        else:
            tests.append(lambda labels, k=key: k in labels)
    return lambda labels: all(t(labels) for t in tests)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return ""
        cur = cur[part]
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(text: str) -> Callable[[Mapping[str, Any]], bool]:
    tests: list[Callable[[Mapping[str, Any]], bool]] = []
    for req in _split_top_level(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", req)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {req!r}")
        path, op, val = m.groups()
        if op == "!=":
            tests.append(lambda o, p=path, v=val: _field_value(o, p) != v)
        else:
            tests.append(lambda o, p=path, v=val: _field_value(o, p) == v)
    return lambda obj: all(t(obj) for t in tests)
