"""Loopback ports leased for the life of a replicated test Redis, outside the kernel's ephemeral range.

Why: a Sentinel remembers every address it has seen as a master or replica and, when a
killed master's address answers again, turns whatever answers there into a replica of the
new master. A port probed free with ``bind(0)`` comes from the ephemeral range, so after a
failover test kills its master, a parallel test's private Redis could be handed that port and
be made read-only under it (seen in CI: ``ReadOnlyError`` from a plain ``EmbeddedRedis``).
Ports below the ephemeral range are never handed out by ``bind(0)``, nor used as the local
end of an outgoing connection; a lock file per port keeps two test processes apart.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path
from types import TracebackType

_SPAN = 8000  # how many ports below the ephemeral range are used for leases


def ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def leasable_range() -> range:
    high = ephemeral_low()
    return range(max(1024, high - _SPAN), high)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as redis-server binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PortLease:
    """``n`` ports, each held by an exclusive lock file until ``release()`` (or the process's exit)."""

    def __init__(self, n: int, lock_dir: Path | None = None, rng: random.Random | None = None) -> None:
        self._dir = lock_dir or Path(tempfile.gettempdir()) / "powerfleet-port-leases"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._held: dict[int, int] = {}
        candidates = list(leasable_range())
        (rng or random.Random()).shuffle(candidates)
        for port in candidates:
            if len(self._held) == n:
                break
            fd = os.open(self._dir / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if _bindable(port):
                self._held[port] = fd
            else:
                os.close(fd)  # something outside the tests holds it
        if len(self._held) < n:
            self.release()
            raise RuntimeError(f"could not lease {n} loopback ports in {leasable_range()}")

    @property
    def ports(self) -> list[int]:
        return list(self._held)

    def release(self) -> None:
        held, self._held = self._held, {}
        for fd in held.values():
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> "PortLease":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
