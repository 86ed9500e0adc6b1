"""A loopback Kubernetes API server: a TEST AND DEMO FIXTURE, NOT A PRODUCTION COMPONENT.

No real API server can run where powerfleet is developed and demonstrated, so this module
serves the small subset of the Kubernetes REST API that powerfleet uses, on 127.0.0.1 over
plain HTTP, so that the *official* ``kubernetes`` Python client can talk to it through a
generated kubeconfig. It has no authentication, no admission, no validation beyond what is
listed here, no garbage collection and no graceful deletion. Never expose it or point
anything real at it.

What it implements (docs/cluster.md has the full list):

* resources: core/v1 pods, nodes, events; coordination.k8s.io/v1 leases; events.k8s.io/v1
  events; nvidia.com/v1alpha1 dynamographdeployments (more via ``register``);
* GET, LIST (label selectors ``=, ==, !=, in, notin, exists, !exists``; field selectors on any
  dotted path, e.g. ``spec.nodeName``, ``metadata.name``, ``status.phase``), CREATE (incl.
  ``generateName``), UPDATE (stale ``metadata.resourceVersion`` -> 409 Conflict), PATCH
  (merge-patch; strategic-merge-patch treated as merge-patch; JSON patch when the body is a
  list), DELETE (with resourceVersion/uid preconditions), deletecollection;
* ``/status`` subresources: PUT/PATCH there change only ``status``; the main endpoint keeps
  the stored status;
* WATCH (``?watch=true``): chunked JSON lines ``{"type", "object"}``, resumable from a
  ``resourceVersion`` while it is still in the event log (else an ERROR event with 410);
* one global resourceVersion counter; ``generation`` bumps when ``spec`` changes;
* optional persistence to one JSON file (loaded at start, written atomically after every
  change and at stop) so a demo can be stopped and resumed.

Usage::

    with ApiServer() as api:
        api.write_kubeconfig(tmp / "kubeconfig")
        api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"}})
"""

from __future__ import annotations

import copy
import json
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from powerfleet.clock import Clock, SystemClock

Obj = dict[str, Any]
_LOG_LIMIT = 10_000


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    delete_returns_object: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "pods", "Pod", status_subresource=True, delete_returns_object=True),
    ResourceType("", "v1", "nodes", "Node", namespaced=False, status_subresource=True),
    ResourceType("", "v1", "events", "Event"),
    ResourceType("events.k8s.io", "v1", "events", "Event"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType(
        "nvidia.com", "v1alpha1", "dynamographdeployments", "DynamoGraphDeployment",
        status_subresource=True, delete_returns_object=True,
    ),
)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        return {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "details": self.details, "code": self.code,
        }


# --- selectors --------------------------------------------------------------------------------

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


# --- patches ----------------------------------------------------------------------------------


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
            parent = parent[int(p)] if isinstance(parent, list) else parent.get(p) if isinstance(parent, dict) else None
            if parent is None:
                raise ApiError(422, "Invalid", f"path {op['path']!r} does not exist")
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
            raise ApiError(422, "Invalid", f"cannot {kind} at {op['path']!r}") from None
    return doc


# --- the store --------------------------------------------------------------------------------


class Store:
    """Thread-safe in-memory objects with one global resourceVersion counter and an event log."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.cond = threading.Condition(threading.RLock())
        self.rv = 0
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self.log: deque[tuple[int, str, tuple[str, str], Obj]] = deque(maxlen=_LOG_LIMIT)
        self.on_change: Callable[[], None] | None = None

    def _now(self) -> str:
        return datetime.fromtimestamp(self.clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _bump(self, rt: ResourceType, event: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, event, rt.key, copy.deepcopy(obj)))
        if self.on_change is not None:
            self.on_change()
        self.cond.notify_all()

    def bucket(self, rt: ResourceType) -> dict[tuple[str, str], Obj]:
        return self.objects.setdefault(rt.key, {})

    def _existing(self, rt: ResourceType, key: tuple[str, str]) -> Obj:
        obj = self.bucket(rt).get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f'{rt.plural}.{rt.group or "core"} "{key[1]}" not found',
                           {"name": key[1], "group": rt.group, "kind": rt.plural})
        return obj

    def get(self, rt: ResourceType, ns: str, name: str) -> Obj:
        with self.cond:
            return copy.deepcopy(self._existing(rt, (ns if rt.namespaced else "", name)))

    def list(self, rt: ResourceType, ns: str | None, label: Callable[..., bool], field: Callable[..., bool]) -> tuple[list[Obj], int]:
        with self.cond:
            items = [
                copy.deepcopy(o)
                for (ons, _), o in sorted(self.bucket(rt).items())
                if (ns is None or ons == ns) and label(o["metadata"].get("labels") or {}) and field(o)
            ]
            return items, self.rv

    def create(self, rt: ResourceType, ns: str, obj: Obj, *, keep_status: bool) -> Obj:
        with self.cond:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                else:
                    raise ApiError(422, "Invalid", f"{rt.kind}: metadata.name: Required value")
            if rt.namespaced:
                if meta.get("namespace") not in (None, "", ns):
                    raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace in the request")
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            key = (ns if rt.namespaced else "", meta["name"])
            if key in self.bucket(rt):
                raise ApiError(409, "AlreadyExists", f'{rt.plural}.{rt.group or "core"} "{meta["name"]}" already exists',
                               {"name": meta["name"], "group": rt.group, "kind": rt.plural})
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
            # keep_status (seeding via apply) keeps what the caller wrote; HTTP create does not.
            if not (keep_status and meta.get("uid")):
                meta["uid"] = str(uuid.uuid4())
            if not (keep_status and meta.get("creationTimestamp")):
                meta["creationTimestamp"] = self._now()
            if "spec" in obj and not (keep_status and meta.get("generation")):
                meta["generation"] = 1
            if rt.status_subresource and not keep_status:
                obj.pop("status", None)
                if rt.kind == "Pod":
                    obj["status"] = {"phase": "Pending"}
            self.bucket(rt)[key] = obj
            self._bump(rt, "ADDED", obj)
            return copy.deepcopy(obj)

    def replace(self, rt: ResourceType, ns: str, name: str, new: Obj, *, subresource: str | None, require_rv: bool, raw: bool = False) -> Obj:
        """UPDATE semantics; ``raw`` (apply) replaces everything including status."""
        with self.cond:
            key = (ns if rt.namespaced else "", name)
            old = self._existing(rt, key)
            new = copy.deepcopy(new)
            meta = new.setdefault("metadata", {})
            if meta.get("name") not in (None, name):
                raise ApiError(400, "BadRequest", "the name of the object does not match the name in the request")
            rv = meta.get("resourceVersion")
            if rv not in (None, "") and str(rv) != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {rt.plural}.{rt.group or "core"} "{name}": '
                               "the object has been modified; please apply your changes to the latest version and try again",
                               {"name": name, "group": rt.group, "kind": rt.plural})
            if rv in (None, "") and require_rv:
                raise ApiError(422, "Invalid", f"{rt.kind} {name!r}: metadata.resourceVersion: must be specified for an update")
            if subresource == "status":
                merged = copy.deepcopy(old)
                if "status" in new:
                    merged["status"] = new["status"]
                else:
                    merged.pop("status", None)
                new = merged
            elif rt.status_subresource and not raw:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            meta = new["metadata"]
            keep = old["metadata"]
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = ns
            meta["uid"] = keep["uid"]
            meta["creationTimestamp"] = keep.get("creationTimestamp")
            meta["resourceVersion"] = keep["resourceVersion"]
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
            if "generation" in keep:
                meta["generation"] = keep["generation"] + (1 if new.get("spec") != old.get("spec") else 0)
            if new == old:
                return copy.deepcopy(old)  # no-op: no new resourceVersion, no event
            self.bucket(rt)[key] = new
            self._bump(rt, "MODIFIED", new)
            return copy.deepcopy(new)

    def delete(self, rt: ResourceType, ns: str, name: str, preconditions: Mapping[str, Any] | None = None) -> Obj:
        with self.cond:
            key = (ns if rt.namespaced else "", name)
            old = self._existing(rt, key)
            pre = preconditions or {}
            if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {rt.plural} "{name}": Precondition failed: '
                               f'ResourceVersion in precondition: {pre["resourceVersion"]}, '
                               f'ResourceVersion in object meta: {old["metadata"]["resourceVersion"]}')
            if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.plural} "{name}": Precondition failed: UID')
            del self.bucket(rt)[key]
            self._bump(rt, "DELETED", old)
            return copy.deepcopy(old)

    def snapshot(self) -> Obj:
        with self.cond:
            objs = [copy.deepcopy(o) for bucket in self.objects.values() for _, o in sorted(bucket.items())]
            return {"version": 1, "resourceVersion": self.rv, "objects": objs}


# --- HTTP -------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet fixture
        pass

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "request body is not valid JSON") from None

    def _dispatch(self, method: str) -> None:
        try:
            self.server.api.handle(self, method)
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 - a fixture must answer, not die
            self._send(500, ApiError(500, "InternalError", f"{type(exc).__name__}: {exc}").status())

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    api: ApiServer


@dataclass(frozen=True)
class _Route:
    rt: ResourceType
    namespace: str | None  # None: all namespaces (or cluster-scoped)
    name: str | None
    subresource: str | None


class ApiServer:
    """The loopback API server (fixture, not production). See the module docstring."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        persist_path: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
    ) -> None:
        self.host = host
        self._port = port
        self.persist_path = Path(persist_path) if persist_path else None
        self.store = Store(clock or SystemClock())
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rt in resources:
            self.register(rt)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        if self.persist_path is not None and self.persist_path.exists():
            self._load(self.persist_path)
        if self.persist_path is not None:
            self.store.on_change = self._persist

    # -- lifecycle --

    def register(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt

    def start(self) -> ApiServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self._port), _Handler)
        self._httpd.api = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="loopback-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self.store.cond:
            self.store.cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.persist_path is not None:
            self._persist()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the loopback API server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def write_kubeconfig(self, path: str | os.PathLike[str], *, namespace: str = "default") -> Path:
        """Write a kubeconfig the official client loads (``new_client_from_config(config_file=path)``)."""
        name = "powerfleet-loopback"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {"token": "loopback-fixture"}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
            "current-context": name,
            "preferences": {},
        }
        out = Path(path)
        out.write_text(yaml.safe_dump(config, sort_keys=False))
        return out

    # -- seeding and inspection (Python, no HTTP) --

    def _type_of(self, obj: Mapping[str, Any]) -> ResourceType:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise ValueError(f"unknown apiVersion/kind {api_version}/{kind}")

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create or fully replace an object, status included (seeding for tests and the twin)."""
        rt = self._type_of(obj)
        meta = obj.get("metadata") or {}
        ns = (meta.get("namespace") or "default") if rt.namespaced else ""
        with self.store.cond:
            if (ns, meta.get("name")) in self.store.bucket(rt):
                body = copy.deepcopy(dict(obj))
                body.setdefault("metadata", {}).pop("resourceVersion", None)
                return self.store.replace(rt, ns, meta["name"], body, subresource=None, require_rv=False, raw=True)
            return self.store.create(rt, ns, dict(obj), keep_status=True)

    def get(self, api_version: str, kind: str, name: str, namespace: str = "default") -> Obj:
        rt = self._type_of({"apiVersion": api_version, "kind": kind})
        return self.store.get(rt, namespace if rt.namespaced else "", name)

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        rt = self._type_of({"apiVersion": api_version, "kind": kind})
        items, _ = self.store.list(rt, namespace, lambda _l: True, lambda _o: True)
        return items

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "default") -> Obj:
        rt = self._type_of({"apiVersion": api_version, "kind": kind})
        return self.store.delete(rt, namespace if rt.namespaced else "", name)

    # -- persistence --

    def _load(self, path: Path) -> None:
        data = json.loads(path.read_text())
        with self.store.cond:
            for obj in data.get("objects", []):
                rt = self._type_of(obj)
                meta = obj["metadata"]
                self.store.bucket(rt)[(meta.get("namespace", "") if rt.namespaced else "", meta["name"])] = obj
            self.store.rv = int(data.get("resourceVersion", 0))

    def _persist(self) -> None:
        assert self.persist_path is not None
        # Under the store's lock (re-entrant): changes are persisted in order, and stop() cannot
        # take the locks in the opposite order.
        with self.store.cond:
            data = json.dumps(self.store.snapshot(), indent=1, sort_keys=True)
            tmp = self.persist_path.with_name(self.persist_path.name + ".tmp")
            tmp.write_text(data)
            os.replace(tmp, self.persist_path)

    # -- routing --

    def _route(self, path: str) -> _Route | Obj:
        parts = [p for p in path.split("/") if p]
        if parts in (["version"], ["version", ""]):
            return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-powerfleet-loopback", "platform": "fixture"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if parts == ["apis"]:
            groups = sorted({(rt.group, rt.version) for rt in self._types.values() if rt.group})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                 "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]}
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
        rt = self._types.get((group, version, rest[0]))
        if rt is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        if rt.namespaced and namespace is None and len(rest) > 1:
            raise ApiError(404, "NotFound", f"{rt.plural} is namespaced ({path})")
        if not rt.namespaced and namespace is not None:
            raise ApiError(404, "NotFound", f"{rt.plural} is cluster-scoped ({path})")
        sub = rest[2] if len(rest) == 3 else None
        if sub is not None and not (sub == "status" and rt.status_subresource):
            raise ApiError(404, "NotFound", f"no subresource {sub!r} on {rt.plural}")
        return _Route(rt, namespace if rt.namespaced else None, rest[1] if len(rest) > 1 else None, sub)

    def handle(self, req: _Handler, method: str) -> None:
        split = urlsplit(req.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        route = self._route(split.path)
        if not isinstance(route, _Route):
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "method not allowed")
            req._send(200, route)
            return
        rt, ns, name = route.rt, route.namespace or "", route.name
        store = self.store
        if method == "GET" and name is None:
            label = parse_label_selector(query.get("labelSelector", ""))
            field = parse_field_selector(query.get("fieldSelector", ""))
            if query.get("watch") in ("true", "1"):
                self._watch(req, rt, route.namespace, label, field, query)
                return
            items, rv = store.list(rt, route.namespace, label, field)
            req._send(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                            "metadata": {"resourceVersion": str(rv)}, "items": items})
            return
        if method == "GET":
            req._send(200, store.get(rt, ns, name))
            return
        body = req._body()
        if method == "POST" and name is None:
            if not isinstance(body, Mapping):
                raise ApiError(400, "BadRequest", "expected an object body")
            req._send(201, store.create(rt, ns, dict(body), keep_status=False))
            return
        if method == "DELETE" and name is None:
            label = parse_label_selector(query.get("labelSelector", ""))
            field = parse_field_selector(query.get("fieldSelector", ""))
            items, _ = store.list(rt, route.namespace, label, field)
            for it in items:
                store.delete(rt, it["metadata"].get("namespace", ""), it["metadata"]["name"])
            req._send(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                            "metadata": {"resourceVersion": str(store.rv)}, "items": items})
            return
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} needs an object name")
        if method == "PUT":
            if not isinstance(body, Mapping):
                raise ApiError(400, "BadRequest", "expected an object body")
            require = rt.group not in ("", "coordination.k8s.io", "events.k8s.io") and route.subresource is None
            req._send(200, store.replace(rt, ns, name, dict(body), subresource=route.subresource, require_rv=require))
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
                result = store.replace(rt, ns, name, patched, subresource=route.subresource, require_rv=False)
            req._send(200, result)
            return
        if method == "DELETE":
            pre = body.get("preconditions") if isinstance(body, Mapping) else None
            old = store.delete(rt, ns, name, pre)
            if rt.delete_returns_object:
                req._send(200, old)
            else:
                req._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                "details": {"name": name, "group": rt.group, "kind": rt.plural,
                                            "uid": old["metadata"]["uid"]}})
            return
        raise ApiError(405, "MethodNotAllowed", f"method {method} not allowed")

    # -- watch --

    def _watch(self, req: _Handler, rt: ResourceType, ns: str | None, label: Callable[..., bool],
               field: Callable[..., bool], query: Mapping[str, str]) -> None:
        store = self.store
        timeout = float(query.get("timeoutSeconds") or 1800)
        # The watch timeout is wall-clock, independent of the injected clock.
        deadline = time.monotonic() + timeout
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Transfer-Encoding", "chunked")
        req.end_headers()

        def emit(event: Obj) -> None:
            data = json.dumps(event).encode() + b"\n"
            req.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            req.wfile.flush()

        def matches(obj: Obj) -> bool:
            return ((ns is None or obj["metadata"].get("namespace") == ns)
                    and label(obj["metadata"].get("labels") or {}) and field(obj))

        rv_param = query.get("resourceVersion") or ""
        pending: list[Obj] = []
        with store.cond:
            if rv_param in ("", "0"):
                last = store.rv
                items, _ = store.list(rt, ns, label, field)
                pending = [{"type": "ADDED", "object": o} for o in items]
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
        try:
            for ev in pending:
                emit(ev)
            while last >= 0 and not self._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with store.cond:
                    store.cond.wait_for(lambda: store.rv > last or self._stopping.is_set(), timeout=min(remaining, 1.0))
                    fresh = [(rv, t, o) for rv, t, key, o in store.log if rv > last and key == rt.key]
                    last = store.rv
                for _rv, typ, obj in fresh:
                    if matches(obj):
                        emit({"type": typ, "object": obj})
            req.wfile.write(b"0\r\n\r\n")
            req.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        req.close_connection = True
