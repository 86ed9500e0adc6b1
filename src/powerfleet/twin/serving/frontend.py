"""A loopback frontend serving the KV router's admin endpoint ``/router_policy`` (a fixture).

The contract (docs/retune.md, "Router policy endpoint"):

* ``GET /router_policy`` -> 200 ``{"revision": n, "policy": {all eight parameters}}``
* ``PATCH /router_policy`` with ``{"revision": n, "policy": {any subset}}`` -> 200 with the new
  revision and policy; 409 ``{"error", "revision"}`` when ``n`` is not the current revision;
  400 ``{"error"}`` for a body that is not that shape or a value out of its domain.
* The revision never repeats across restarts: it is ``epoch * 2**32 + writes``, and every
  start of the frontend process (``restart``) takes a new, larger epoch, so a PATCH carrying
  a revision read before a restart is refused even after as many writes (issue 33 item 4).

Like the real endpoint it is unauthenticated. Every accepted or refused PATCH is logged in
``writes`` (with the caller's ``X-Powerfleet-Leader`` header) so tests can tell who wrote.
The digital twin reuses this class for its simulated frontends.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from powerfleet.sim.policy import RouterPolicy, parse_policy
from powerfleet.twin.apiserver.http import LoopbackHTTPServer

PATH = "/router_policy"
MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class PatchRecord:
    revision_sent: Any
    policy_sent: Any
    status: int
    leader: str | None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read .writes instead
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != PATH:
            self._reply(404, {"error": f"no such path {self.path}"})
            return
        self._reply(200, self.server.frontend.snapshot())

    def do_PATCH(self) -> None:
        if self.path != PATH:
            self._reply(404, {"error": f"no such path {self.path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"error": "body too large"})
            return
        raw = self.rfile.read(length)
        status, body = self.server.frontend.patch(raw, self.headers.get("X-Powerfleet-Leader"))
        self._reply(status, body)


# Revisions of one epoch (one start of the frontend): the next epoch starts above them all.
EPOCH_SPAN = 2**32


class _Server(LoopbackHTTPServer):
    frontend: LoopbackFrontend


class LoopbackFrontend:
    """One frontend's router policy behind a loopback HTTP server."""

    def __init__(self, policy: dict[str, Any] | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._initial = parse_policy(policy)
        self._policy = self._initial
        self.epoch = 0  # the first start keeps revision 0; each restart moves to a new epoch
        self._revision = 0
        self.writes: list[PatchRecord] = []
        self._host, self._port = host, port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --
    def start(self) -> LoopbackFrontend:
        self._httpd = _Server((self._host, self._port), _Handler)
        self._httpd.frontend = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="loopback-frontend", daemon=True)
        self._thread.start()
        return self

    def restart(self) -> LoopbackFrontend:
        """The frontend process restarted under the same pod (and URL): its policy is back to
        the one it was started with and its revision starts in a new epoch."""
        with self._lock:
            self.epoch += 1
            self._policy = self._initial
            self._revision = self.epoch * EPOCH_SPAN
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> LoopbackFrontend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "frontend not started"
        return f"http://{self._host}:{self._httpd.server_address[1]}"

    # -- state --
    @property
    def policy(self) -> RouterPolicy:
        with self._lock:
            return self._policy

    @property
    def revision(self) -> int:
        with self._lock:
            return self._revision

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"revision": self._revision, "policy": self._policy.model_dump()}

    def patch(self, raw: bytes, leader: str | None = None) -> tuple[int, dict[str, Any]]:
        """Apply one PATCH body; returns (HTTP status, JSON body)."""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._log(400, {"error": "body is not JSON"}, None, None, leader)
        if not isinstance(body, dict) or set(body) != {"revision", "policy"}:
            return self._log(400, {"error": "body must be {\"revision\": int, \"policy\": {...}}"}, None, None, leader)
        rev, pol = body["revision"], body["policy"]
        if isinstance(rev, bool) or not isinstance(rev, int) or not isinstance(pol, dict):
            return self._log(400, {"error": "revision must be an integer and policy an object"}, rev, pol, leader)
        with self._lock:
            if rev != self._revision:
                return self._log(409, {"error": "revision conflict", "revision": self._revision}, rev, pol, leader)
            try:
                new = parse_policy(pol, base=self._policy)
            except ValueError as exc:
                return self._log(400, {"error": str(exc)}, rev, pol, leader)
            self._policy = new
            self._revision += 1
            return self._log(200, {"revision": self._revision, "policy": new.model_dump()}, rev, pol, leader)

    def _log(self, status: int, body: dict[str, Any], rev: Any, pol: Any, leader: str | None) -> tuple[int, dict[str, Any]]:
        self.writes.append(PatchRecord(rev, pol, status, leader))
        return status, body
