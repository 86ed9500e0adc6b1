"""ApiServer: the loopback server's lifecycle, kubeconfig, Python-side seeding and JSON-file persistence."""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from powerfleet.clock import Clock, SystemClock
from powerfleet.twin.apiserver import verbs
from powerfleet.twin.apiserver.admission import admit
from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.faults import Faults
from powerfleet.twin.apiserver.pages import Pages
from powerfleet.twin.apiserver.http import Handler, HTTPServer
from powerfleet.twin.apiserver.options import ServerOptions
from powerfleet.twin.apiserver.resources import DEFAULT_RESOURCES, Registry, ResourceType
from powerfleet.twin.apiserver.store import Store
from powerfleet.twin.apiserver.versions import Versions


class ApiServer:
    """The loopback API server (fixture, not production). See the package docstring."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        persist_path: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
        options: ServerOptions | None = None,
    ) -> None:
        self.options = options or ServerOptions()
        self.host = host
        self._port = port
        self.persist_path = Path(persist_path) if persist_path else None
        self.store = Store(clock or SystemClock())
        self.registry = Registry(resources)
        self.faults = Faults()  # 429/5xx shares and held requests, off until told (faults.py)
        self.pages = Pages(self.store.clock)  # chunked LISTs' continue tokens (pages.py)
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        if self.persist_path is not None and self.persist_path.exists():
            self._load(self.persist_path)
        if self.persist_path is not None:
            self.store.on_change = self._persist

    # -- lifecycle --

    def register(self, rt: ResourceType) -> None:
        self.registry.register(rt)

    def start(self) -> ApiServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = HTTPServer((self.host, self._port), self.handle)
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
        return self.registry.of_object(obj)

    def _versions(self, rt: ResourceType) -> Versions:
        return Versions.of(rt, self.registry, enabled=self.options.convert)

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create or fully replace an object, status included (seeding for tests and the twin).
        Returned in the version it was given in; stored in the storage version."""
        rt = self._type_of(obj)
        versions = self._versions(rt)
        # Seeding writes what would be in etcd: pruned and defaulted as a real server does on
        # read, not validated (a stored object may predate its schema; clients' writes are).
        obj, _ = admit(rt, dict(obj), subresource=None, field_validation="Ignore", options=self.options,
                       validate=False)
        meta = obj.get("metadata") or {}
        ns = (meta.get("namespace") or "default") if rt.namespaced else ""
        srt = versions.storage_rt
        with self.store.cond:
            if (ns, meta.get("name")) in self.store.bucket(srt):
                body = versions.stored(copy.deepcopy(dict(obj)), self.store.get(srt, ns, meta["name"]))
                body.setdefault("metadata", {}).pop("resourceVersion", None)
                return versions.served(self.store.replace(srt, ns, meta["name"], body, subresource=None,
                                                          require_rv=False, raw=True))
            return versions.served(self.store.create(srt, ns, versions.stored(dict(obj), None), keep_status=True))

    def get(self, api_version: str, kind: str, name: str, namespace: str = "default") -> Obj:
        rt = self._type_of({"apiVersion": api_version, "kind": kind})
        return self._versions(rt).served(self.store.get(rt, namespace if rt.namespaced else "", name))

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        rt = self._type_of({"apiVersion": api_version, "kind": kind})
        items, _ = self.store.list(rt, namespace, lambda _l: True, lambda _o: True)
        return [self._versions(rt).served(i) for i in items]

    def update(self, api_version: str, kind: str, name: str, namespace: str, mutate: Callable[[Obj], None]) -> Obj:
        """Read, ``mutate`` in place and write back (``apply``), under the store's lock: no other
        writer comes in between (a real server's counterpart: testing/controlplane/twin_api.py)."""
        with self.store.cond:
            obj = self.get(api_version, kind, name, namespace)
            mutate(obj)
            return self.apply(obj)

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

    # -- HTTP --

    def handle(self, req: Handler, method: str) -> None:
        try:
            self.faults.before(method, req.path)
        except ApiError:
            req.json_body()  # read what was sent, so the kept-alive connection stays in step
            raise
        verbs.handle(self.store, self.registry, self._stopping, req, method, self.options, self.pages)
