"""What a real kube-apiserver refuses or rewrites before an object is stored (docs/cluster.md):

* object metadata limits, for every kind: a name of at most 253 characters in DNS-subdomain
  form, label values of at most 63 characters (and label names), annotations of at most
  256 KiB in total -> 422 Invalid naming the field;
* a Lease's ``acquireTime``/``renewTime`` are MicroTimes, parsed as Go's RFC3339Micro (six fraction
  digits and a zone) -> 400 BadRequest ``cannot be handled as a Lease`` otherwise;
* the structural schema of a custom resource (``crds.py``, ``schema.py``): unknown fields pruned,
  defaults applied, types/enums/required/bounds validated -> 422 Invalid with one cause per
  field; ``fieldValidation``: ``Strict`` -> 400 BadRequest ``strict decoding error: unknown
  field "spec.x"`` (what a real server answers), ``Warn`` (the default) -> one ``Warning``
  header per pruned field, ``Ignore`` -> silence.

A write to the main resource leaves the status alone (the store keeps the stored one) and a
write to ``/status`` only checks the status; a DGD's status is checked only when
``ServerOptions.prune_dgd_status`` is set (twin/fidelity.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from powerfleet.twin.apiserver.crds import crd_of
from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.options import ServerOptions
from powerfleet.twin.apiserver.resources import ResourceType
from powerfleet.twin.apiserver.schema import structural

MAX_NAME = 253
MAX_LABEL_VALUE = 63
MAX_ANNOTATIONS_BYTES = 256 * 1024
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
FIELD_VALIDATION = ("Strict", "Warn", "Ignore")
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
MICRO_TIMES = {"Lease": ("acquireTime", "renewTime")}


def check_micro_times(rt: ResourceType, obj: Mapping[str, Any]) -> None:
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    for key in MICRO_TIMES.get(rt.kind, ()):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and _MICRO_TIME.fullmatch(value)):
            version = rt.api_version.rsplit("/", 1)[-1]
            raise ApiError(400, "BadRequest", f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: '
                           f'parsing time {json.dumps(value)} as "2006-01-02T15:04:05.000000Z07:00"')


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    text = "; ".join(f"{path}: {msg}" for path, msg in causes)
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}',
                    {"name": name, "group": rt.group, "kind": rt.kind,
                     "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": path} for path, msg in causes]})


def check_metadata(rt: ResourceType, obj: Mapping[str, Any]) -> None:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    name = str(meta.get("name") or meta.get("generateName") or "")
    causes: list[tuple[str, str]] = []
    if meta.get("name") is not None:
        raw = str(meta["name"])
        if len(raw) > MAX_NAME:
            causes.append(("metadata.name", f"Invalid value: {raw[:20]!r}...: must be no more than {MAX_NAME} characters"))
        elif not _SUBDOMAIN.fullmatch(raw):
            causes.append(("metadata.name", f"Invalid value: {raw!r}: a lowercase RFC 1123 subdomain must consist of "
                                            "lower case alphanumeric characters, '-' or '.'"))
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    for key, value in labels.items():
        label_name = str(key).rsplit("/", 1)[-1]
        if len(label_name) > MAX_LABEL_VALUE or not _LABEL_NAME.fullmatch(label_name):
            causes.append(("metadata.labels", f"Invalid value: {key!r}: name part must be no more than 63 characters "
                                               "of alphanumerics, '-', '_' or '.'"))
        if not isinstance(value, str):
            continue
        if len(value) > MAX_LABEL_VALUE:
            causes.append(("metadata.labels", f"Invalid value: {value[:20]!r}...: must be no more than 63 characters"))
        elif not _LABEL_VALUE.fullmatch(value):
            causes.append(("metadata.labels", f"Invalid value: {value!r}: a valid label must consist of alphanumerics, "
                                               "'-', '_' or '.'"))
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    total = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
    if total > MAX_ANNOTATIONS_BYTES:
        causes.append(("metadata.annotations", f"Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes"))
    if causes:
        raise invalid(rt, name, causes)


def admit(rt: ResourceType, obj: Obj, *, subresource: str | None, field_validation: str,
          options: ServerOptions, validate: bool = True) -> tuple[Obj, list[str]]:
    """The object as the server would store it, and the warnings to send; raises ApiError.
    ``validate=False`` (seeding: what is already in etcd, perhaps from before the schema) prunes
    and defaults only, as a real server does when it reads a stored object."""
    if field_validation not in FIELD_VALIDATION:
        raise ApiError(400, "BadRequest", f"fieldValidation must be one of {', '.join(FIELD_VALIDATION)}, "
                                          f"got {field_validation!r}")
    if validate:
        check_metadata(rt, obj)
        check_micro_times(rt, obj)
    crd = crd_of(rt) if options.schemas else None
    if crd is None or rt.version not in crd.schemas:
        return obj, []
    # With conversion a body is in the endpoint's version (versions.py refuses any other).
    # Without it (ServerOptions.convert off) an object keeps the version it was written in,
    # whichever endpoint serves it: it is checked against that version's schema.
    group, _, version = str(obj.get("apiVersion") or "").rpartition("/")
    by_body = not options.convert and group == rt.group and version in crd.schemas
    schema = crd.schemas[version if by_body else rt.version]
    props = schema.get("properties") or {}
    check_status = rt.kind != "DynamoGraphDeployment" or options.prune_dgd_status
    name = str((obj.get("metadata") or {}).get("name") or "")
    unknown: list[str] = []
    errors: list[tuple[str, str]] = []
    out = dict(obj)
    if subresource == "status":
        if check_status and "status" in obj and "status" in props:
            res = structural(obj["status"], props["status"], "status")
            out["status"], unknown, errors = res.value, res.unknown, res.errors
    else:
        body = {k: v for k, v in obj.items() if k != "status"}
        res = structural(body, {**schema, "properties": {k: v for k, v in props.items() if k != "status"}})
        out = {**res.value, **({"status": obj["status"]} if "status" in obj else {})}
        unknown, errors = res.unknown, res.errors
    if unknown and field_validation == "Strict":
        version = rt.api_version.rsplit("/", 1)[-1]
        raise ApiError(400, "BadRequest", f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: '
                       "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
    if errors and validate:
        raise invalid(rt, name, errors)
    warnings = [f'unknown field "{u}"' for u in unknown] if field_validation == "Warn" else []
    return out, warnings


def warning_header(text: str) -> str:
    """An RFC 7234 warning as kube-apiserver sends it: ``299 - "<text>"``."""
    return "299 - " + json.dumps(text)
