"""The HTTP layer: a threading HTTP/1.1 server whose handler turns requests into verb calls and errors into Status."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from powerfleet.twin.apiserver.errors import ApiError, Obj


MAX_BODY_BYTES = 3 * 1024 * 1024


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: a response goes out in two sends (headers, then body); with Nagle's algorithm
    # the second waits for the client's delayed ACK (about 40 ms on Linux) on every call, which a
    # real API server never costs.
    disable_nagle_algorithm = True
    server: HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet fixture
        pass

    def send_json(self, code: int, body: Obj, headers: Iterable[tuple[str, str]] = ()) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def json_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            # As kube-apiserver: a request body over 3 MiB is refused, never decoded (it is
            # read and dropped, so the client sees the answer rather than a broken pipe).
            self.close_connection = True
            left = length
            while left > 0:
                left -= len(self.rfile.read(min(left, 1 << 20)) or b"x" * left)
            raise ApiError(413, "RequestEntityTooLarge", f"the request body is {length} bytes; the limit is {MAX_BODY_BYTES}")
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "request body is not valid JSON") from None

    def _dispatch(self, method: str) -> None:
        try:
            self.server.handle_api(self, method)
        except ApiError as exc:
            self.send_json(exc.code, exc.status(), exc.headers)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 - a fixture must answer, not die
            self.send_json(500, ApiError(500, "InternalError", f"{type(exc).__name__}: {exc}").status())

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


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server for the twin's loopback endpoints that stays quiet when a client
    goes away mid-request (a worker killed or restarted by a scenario: a connection reset is what
    a real server logs at most as a line, not a traceback on the demo's stderr)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)


class HTTPServer(LoopbackHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handle: Callable[[Handler, str], None]) -> None:
        super().__init__(address, Handler)
        self.handle_api = handle
