"""Fault injection for the reliability suite: a loopback API server that can be made to fail.

``FaultyApiServer`` is the twin's loopback Kubernetes API server (unchanged: it subclasses it and
overrides only ``handle``, the one entry point every HTTP request goes through), so the official
client sees real HTTP failures on the wire: a 500 ``InternalError``, a 409 ``Conflict`` on writes,
or a request that is never answered until the client's timeout fires. Python-side seeding
(``apply``/``get``) bypasses HTTP and is never failed, so a test can change the world while the
API is "down" for the fleet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.apiserver.errors import ApiError
from powerfleet.twin.apiserver.http import Handler

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass
class Fault:
    """What to do instead of serving: ``kind`` is "500", "409" (writes only) or "timeout"."""

    kind: str
    stall_s: float = 3.0  # "timeout": hold the request this long without answering
    path_contains: str = ""  # only requests whose path contains this (all when empty)


@dataclass
class FaultLog:
    served: int = 0
    failed: dict[str, int] = field(default_factory=dict)


class FaultyApiServer(ApiServer):
    """ApiServer whose HTTP requests fail while a fault is set (see the module docstring)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.fault: Fault | None = None
        self.log = FaultLog()
        self._healed = threading.Event()

    def handle(self, req: Handler, method: str) -> None:
        fault = self.fault
        hit = fault is not None and fault.path_contains in req.path
        if hit and fault is not None:
            if fault.kind == "500":
                return self._fail(req, fault.kind, ApiError(500, "InternalError", "injected: etcd unavailable"))
            if fault.kind == "409" and method in WRITES:
                return self._fail(req, fault.kind, ApiError(409, "Conflict",
                                                            "injected: the object has been modified"))
            if fault.kind == "timeout":
                self.log.failed["timeout"] = self.log.failed.get("timeout", 0) + 1
                self._healed.wait(fault.stall_s)  # the client gives up first; then drop the connection
                req.close_connection = True
                return None
        self.log.served += 1
        return super().handle(req, method)

    def _fail(self, req: Handler, kind: str, err: ApiError) -> None:
        self.log.failed[kind] = self.log.failed.get(kind, 0) + 1
        length = int(req.headers.get("Content-Length") or 0)
        if length:  # drain the body, or the kept-alive connection reads it as the next request
            req.rfile.read(length)
        req.send_json(err.code, err.status())

    def failures(self, kind: str) -> int:
        return self.log.failed.get(kind, 0)

    @contextmanager
    def failing(self, kind: str, **kw: object) -> Iterator[Fault]:
        """Fail requests while inside the block; heal on leaving it (even on error)."""
        self.fault = Fault(kind, **kw)  # type: ignore[arg-type]
        self._healed.clear()
        try:
            yield self.fault
        finally:
            self.fault = None
            self._healed.set()


class HookedApiServer(ApiServer):
    """ApiServer that runs a callback once, before serving the first request that matches: a test
    acts at a chosen point of a worker's pass (e.g. kills the Redis master while a budget
    evaluation reads its deployment), then the request is served as usual."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._hook: tuple[str, str, Callable[[], None]] | None = None
        self._lock = threading.Lock()
        self.fired = threading.Event()

    def once(self, method: str, path_suffix: str, action: Callable[[], None]) -> threading.Event:
        with self._lock:
            self.fired.clear()
            self._hook = (method, path_suffix, action)
        return self.fired

    def handle(self, req: Handler, method: str) -> None:
        with self._lock:
            hook = self._hook
            hit = hook is not None and hook[0] == method and req.path.split("?")[0].endswith(hook[1])
            if hit:
                self._hook = None
        if hit and hook is not None:
            try:
                hook[2]()
            finally:
                self.fired.set()
        return super().handle(req, method)
