"""The agent's HTTP endpoint: ``/readyz`` and ``/metrics``.

``/readyz`` answers 200 while the last good pass is younger than three reconcile intervals
and 503 otherwise. There is deliberately no liveness endpoint tied to the broker: a Redis
outage must never get agents restarted (a restart restores defaults, dropping caps
fleet-wide), and passes go on without the broker (watch and local timer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class ProbeServer:
    def __init__(self, address: str, port: int, readiness: Callable[[], tuple[bool, str]],
                 registry: CollectorRegistry) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - probes every few seconds
                return

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/readyz":
                    ok, text = outer.readiness()
                    self._send(200 if ok else 503, (text + "\n").encode(), "text/plain; charset=utf-8")
                elif self.path.split("?")[0] == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.readiness = readiness
        self.registry = registry
        self.server = ThreadingHTTPServer((address, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="agent-probe", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> "ProbeServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
