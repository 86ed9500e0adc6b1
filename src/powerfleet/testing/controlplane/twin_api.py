"""The twin's API server on a real control plane (``powerfleet twin|demo --control-plane real``):
the surface of ``ApiServer`` the twin uses (start, stop, url, write_kubeconfig, apply, get, list,
delete, update) served by etcd + kube-apiserver with Dynamo's CRDs. Errors are the loopback
server's ``ApiError`` (same code and reason), so the twin's code handles both alike. A
read-modify-write (``update``) is a merge patch of what changed, at the version read, retried on
409: the real server has no lock the twin can hold. Once stopped, reads are served from what the
server held at the stop (the kinds in ``FINAL_KINDS``), as the loopback server's store stays
readable after it stops: the demo judges and reports after the twin has stopped."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.dgd import DGD_API_VERSION, DGD_KIND
from powerfleet.twin.apiserver.errors import ApiError

from .crds import install_crds
from .objects import RealObjects
from .plane import ControlPlane, kubeconfig_text
from .procs import StartError

log = logging.getLogger(__name__)
Obj = dict[str, Any]
UPDATE_TRIES = 8
FINAL_KINDS = (("v1", "Pod"), ("v1", "ConfigMap"), ("v1", "Node"), ("coordination.k8s.io/v1", "Lease"),
               (DGD_API_VERSION, DGD_KIND))


@contextmanager
def _as_api_error() -> Iterator[None]:
    try:
        yield
    except ApiException as exc:
        raise ApiError(exc.status or 500, str(exc.reason or ""), f"{exc.status} {exc.reason}") from exc


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386: the patch that turns ``old`` into ``new`` (None deletes a key)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return copy.deepcopy(new)
    out: Obj = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old:
            out[key] = copy.deepcopy(value)
        elif old[key] != value:
            out[key] = merge_patch(old[key], value)
    return out


class ControlPlaneDown(OSError):
    """The control plane did not start; the message is the first line of why (its log path in it)."""


class RealApiServer:
    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.plane = ControlPlane(bin_dir, root)
        self._api: client.ApiClient | None = None
        self._lock = threading.Lock()
        self._final: dict[tuple[str, str], list[Obj]] | None = None

    # -- lifecycle --

    def start(self) -> RealApiServer:
        if self._api is not None:
            return self
        try:
            self.plane.start()
        except StartError as exc:
            raise ControlPlaneDown(f"the control plane did not start: {str(exc).splitlines()[0]}") from exc
        try:
            self._api = config.new_client_from_config(config_file=str(self.plane.kubeconfig))
            install_crds(self._api)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._api is not None:
            try:
                self._final = {key: self.list(*key) for key in FINAL_KINDS}
            except Exception as exc:  # noqa: BLE001 -- a server already gone leaves nothing to read; stop it all the same
                log.warning("the control plane's final state could not be read: %s", exc)
                self._final = {}
            finally:
                self._api.close()
                self._api = None
        self.plane.stop()

    @property
    def url(self) -> str:
        return self.plane.url

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        p = self.plane.pki
        out = Path(path)
        out.write_text(kubeconfig_text(self.url, p.ca_crt, cert=p.admin_crt, key=p.admin_key, namespace=namespace))
        return out

    # -- seeding and inspection --

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            raise RuntimeError("the control plane is not running")
        return self._api

    def _res(self, api_version: str, kind: str) -> Any:
        with self._lock:  # discovery is cached by the dynamic client; one at a time
            return dynamic.DynamicClient(self.api).resources.get(api_version=api_version, kind=kind)

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        ns = str((obj.get("metadata") or {}).get("namespace") or "default")
        with _as_api_error():
            return RealObjects(self.api, ns).apply(obj)

    def get(self, api_version: str, kind: str, name: str, namespace: str = "default") -> Obj:
        if self._final is not None:
            for obj in self._final.get((api_version, kind), []):
                if obj["metadata"]["name"] == name and obj["metadata"].get("namespace", namespace) == namespace:
                    return copy.deepcopy(obj)
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found (read after the control plane stopped)')
        res = self._res(api_version, kind)
        with _as_api_error():
            got = res.get(name=name, namespace=namespace if res.namespaced else None)
        return dict(got.to_dict())

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        if self._final is not None:
            return [copy.deepcopy(o) for o in self._final.get((api_version, kind), [])
                    if namespace is None or o["metadata"].get("namespace") == namespace]
        res = self._res(api_version, kind)
        with _as_api_error():
            items = res.get(namespace=namespace if res.namespaced else None).to_dict()["items"]
        return [{"apiVersion": api_version, "kind": kind, **i} for i in items]

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "default") -> Obj:
        res = self._res(api_version, kind)
        with _as_api_error():
            return dict(res.delete(name=name, namespace=namespace if res.namespaced else None).to_dict())

    def update(self, api_version: str, kind: str, name: str, namespace: str,
               mutate: Callable[[Obj], None]) -> Obj:
        """``mutate`` the object as read; written as merge patches at that version (the main
        resource, then its status), read again and retried when another writer came first."""
        res = self._res(api_version, kind)
        ns = namespace if res.namespaced else None
        for _ in range(UPDATE_TRIES):
            with _as_api_error():
                old = dict(res.get(name=name, namespace=ns).to_dict())
            new = copy.deepcopy(old)
            mutate(new)
            rv = old["metadata"]["resourceVersion"]
            main = merge_patch({k: v for k, v in old.items() if k != "status"},
                               {k: v for k, v in new.items() if k != "status"})
            status = merge_patch(old.get("status") or {}, new.get("status") or {})
            try:
                written = old
                if main:
                    main.setdefault("metadata", {})["resourceVersion"] = rv
                    written = res.patch(body=main, name=name, namespace=ns,
                                        content_type="application/merge-patch+json").to_dict()
                    rv = written["metadata"]["resourceVersion"]
                if status:
                    written = res.subresources["status"].patch(
                        body={"metadata": {"resourceVersion": rv}, "status": status}, name=name, namespace=ns,
                        content_type="application/merge-patch+json").to_dict()
                return dict(written)
            except ApiException as exc:
                if exc.status != 409:
                    raise ApiError(exc.status or 500, str(exc.reason or ""), f"{exc.status} {exc.reason}") from exc
        raise ApiError(409, "Conflict", f"{kind} {name}: changed by another writer {UPDATE_TRIES} times in a row")
