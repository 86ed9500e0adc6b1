"""A redis-server that can be crashed (SIGKILL) and restarted with its data, as a persistent
production Redis would be (the chart's ``redis.persistence.enabled`` turns on the append-only file).

``EmbeddedRedis`` (the fleet's own) runs without persistence on purpose; this one writes every
command to the append-only file before answering (``appendfsync always``), so what a client was
told is stored survives the crash.
"""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Self

import redis

from powerfleet.broker.embedded import EmbeddedRedis, find_redis_server
from powerfleet.testing.ports import PortLease
from powerfleet.testing.waiting import wait_for


class CrashableRedis:
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        # Leased, not probed: while it is down after a crash, no parallel test may be handed its port.
        self._lease = PortLease(1)
        self.port = self._lease.ports[0]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        argv = [find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no",
                "--maxmemory-policy", "noeviction", "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        try:
            wait_for(client.ping, f"redis-server on port {self.port} to answer PING", 20)
        finally:
            client.close()
        return self

    def crash(self) -> None:
        """SIGKILL: no shutdown save, clients' connections cut mid-command."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._lease.release()


@contextmanager
def restartable_redis() -> Iterator[EmbeddedRedis]:
    """The fleet's own ``EmbeddedRedis``, on a leased port: a test that stops or kills it and starts
    it again gets the same port back, with no parallel test handed that port in between."""
    with PortLease(1) as lease, EmbeddedRedis(port=lease.ports[0]) as server:
        yield server
