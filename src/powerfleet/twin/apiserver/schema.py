"""Structural schemas as a kube-apiserver applies them to a custom resource on every write:
prune fields the schema does not declare, apply ``default`` values, then validate types, enums,
required fields, bounds, lengths, patterns and ``date-time`` formats.

``structural(obj, schema)`` returns the pruned, defaulted object, the dotted paths of the pruned
fields (what ``fieldValidation`` reports) and the validation errors, each naming its field path
as the real server does (``spec.services.decode.replicas: Invalid value: -1: ...``).

Besides the OpenAPI keywords a CRD uses, two markers of the twin's reduced schemas (crds/):
``x-twin-elided`` (a subtree kept as written, unchecked) and ``x-twin-unlisted: keep`` (a level
that does not list every property; unlisted keys are kept, unchecked).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

Obj = dict[str, Any]


@dataclass
class Result:
    value: Any
    unknown: list[str] = field(default_factory=list)  # pruned field paths
    errors: list[tuple[str, str]] = field(default_factory=list)  # (field path, message)


@lru_cache(maxsize=64)
def _pattern(raw: str) -> re.Pattern[str]:
    return re.compile(raw)


def _type_ok(value: Any, schema: Mapping[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    kind = schema.get("type")
    if kind is None:
        return True
    return {
        "object": lambda v: isinstance(v, Mapping),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    }.get(kind, lambda v: True)(value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def structural(obj: Any, schema: Mapping[str, Any], path: str = "", *, prune: bool = True) -> Result:
    """Prune, default and validate ``obj`` against ``schema`` (see the module docstring)."""
    out = Result(copy.deepcopy(obj))
    out.value = _walk(out.value, schema, path, out, prune)
    return out


def _walk(value: Any, schema: Mapping[str, Any], path: str, out: Result, prune: bool) -> Any:
    if schema.get("x-twin-elided"):
        return value
    if value is None and schema.get("nullable"):
        return value
    if not _type_ok(value, schema):
        want = "integer or string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
        out.errors.append((path, f"Invalid value: {_show(value)}: {path} in body must be of type {want}"))
        return value
    if isinstance(value, Mapping):
        return _object(dict(value), schema, path, out, prune)
    if isinstance(value, list):
        items = schema.get("items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.errors.append((path, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if isinstance(items, Mapping):
            value = [_walk(v, items, f"{path}[{i}]", out, prune) for i, v in enumerate(value)]
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen: set[tuple[Any, ...]] = set()
            for i, v in enumerate(value):
                key = tuple(v.get(k) for k in keys) if isinstance(v, Mapping) else (i,)
                if key in seen:
                    out.errors.append((f"{path}[{i}]", f"Duplicate value: {_show(key[0] if len(key) == 1 else key)}"))
                seen.add(key)
        return value
    _scalar(value, schema, path, out)
    return value


def _object(value: Obj, schema: Mapping[str, Any], path: str, out: Result, prune: bool) -> Obj:
    props: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    # The root's ``metadata: {type: object}`` is ObjectMeta, which the server handles itself.
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-twin-unlisted") == "keep"
                        or path == "metadata")
    for key in list(value):
        sub = _join(path, key)
        if key in props:
            value[key] = _walk(value[key], props[key], sub, out, prune)
        elif isinstance(extra, Mapping):
            value[key] = _walk(value[key], extra, sub, out, prune)
        elif keep_unknown or extra is True:
            continue
        elif prune:
            out.unknown.append(sub)
            del value[key]
    for key, sub_schema in props.items():
        if key not in value and isinstance(sub_schema, Mapping) and "default" in sub_schema:
            value[key] = copy.deepcopy(sub_schema["default"])
    for key in schema.get("required") or []:
        if key not in value:
            out.errors.append((_join(path, key), "Required value"))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        out.errors.append((path, f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
    return value


def _scalar(value: Any, schema: Mapping[str, Any], path: str, out: Result) -> None:
    def bad(why: str) -> None:
        out.errors.append((path, f"Invalid value: {_show(value)}: {why}"))

    if "enum" in schema and value not in schema["enum"]:
        out.errors.append((path, f"Unsupported value: {_show(value)}: supported values: "
                                 + ", ".join(_show(v) for v in schema["enum"])))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            bad(f"{path} in body should be at least {schema['minLength']} chars long")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            bad(f"{path} in body should be at most {schema['maxLength']} chars long")
        if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
            bad(f"{path} in body should match '{schema['pattern']}'")
        if schema.get("format") == "date-time" and not _is_datetime(value):
            bad(f"{path} in body must be of type date-time")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            bad(f"{path} in body should be greater than or equal to {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            bad(f"{path} in body should be less than or equal to {schema['maximum']}")
        if schema.get("format") == "int32" and not -(2**31) <= value < 2**31:
            bad(f"{path} in body must be of format int32")


def _is_datetime(raw: str) -> bool:
    try:
        datetime.fromisoformat(raw)
    except ValueError:
        return False
    return "T" in raw
