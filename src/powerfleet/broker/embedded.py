"""A private redis-server on a free loopback port, for `up`, `demo` and the tests.

Why a real redis-server and not a Python imitation: Celery's Redis transport relies on
BRPOP, pub/sub, Lua (chord counting in 5.7) and key expiry; anything less hides bugs.
The binary comes from Debian's ``redis-server`` package, which `make` installs
(see docs/embedded-broker.md).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Callable

import redis


class BrokerUnavailable(Exception):
    """redis-server is missing or would not start; the message says what to do."""


def find_redis_server() -> str:
    path = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if path is None:
        raise BrokerUnavailable(
            "redis-server not found on PATH: run `make redis` (installs Debian's redis-server) "
            "or set broker.url / POWERFLEET_BROKER__URL to an existing Redis"
        )
    return path


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM (Redis saves and exits), then SIGKILL if it has not exited within ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class EmbeddedRedis:
    """Start/stop a redis-server bound to 127.0.0.1 with its own temporary directory.

    ``restart()`` keeps the port, so clients configured with ``url`` reconnect to it.
    """

    def __init__(self, port: int | None = None, start_timeout_s: float = 10.0,
                 preexec: Callable[[], None] | None = None) -> None:
        self.port = port or free_loopback_port()
        self._may_move = port is None  # a port we probed ourselves: another may take it before Redis binds
        self.preexec = preexec  # run in the child before exec (`up`: die with the parent)
        self.start_timeout_s = start_timeout_s
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "EmbeddedRedis":
        """Start it. A port probed free that another process took before Redis bound it (parallel
        test workers, a busy machine) is probed again, up to three times, on the first start only:
        ``restart()`` keeps its port, which clients already know."""
        for attempt in range(3):
            try:
                return self._start_once()
            except BrokerUnavailable as exc:
                if not (self._may_move and "Address already in use" in str(exc)) or attempt == 2:
                    raise
                self.stop()  # the one that could not bind (it has exited; its pipe is closed)
                self.port = free_loopback_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> "EmbeddedRedis":
        binary = find_redis_server()
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="powerfleet-redis-")
        log = Path(self._dir.name) / "redis.log"
        # noeviction: evicted kombu bindings or RedBeat keys silently break the fleet.
        argv = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self._dir.name,
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
            "--maxmemory-policy", "noeviction", "--logfile", str(log),
        ]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, start_new_session=True, preexec_fn=self.preexec)
        self._wait_ready(log)
        self._may_move = False
        return self

    def _wait_ready(self, log: Path) -> None:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    tail = log.read_text(errors="replace")[-400:] if log.exists() else ""
                    raise BrokerUnavailable(f"redis-server exited with code {self._proc.returncode}: {tail.strip()}")
                try:
                    # Ours, not another Redis that holds the port (ours then exits: address in use).
                    if client.ping() and self._proc is not None and \
                            client.info("server").get("process_id") == self._proc.pid:
                        return
                except redis.ConnectionError:
                    pass
                time.sleep(0.02)  # polling a child process's readiness, bounded by the deadline
            self.stop()
            raise BrokerUnavailable(f"redis-server did not answer PING on port {self.port} within {self.start_timeout_s}s")
        finally:
            client.close()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()

    def kill(self) -> int:
        """SIGKILL the server, as a crash would (its exit status); ``start()`` brings it back on the
        same port, empty (nothing is saved)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        return code

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
