"""Child processes of the control plane: started in their own process group with a parent-death
signal (so a killed test run takes them along), stopped by group, logs kept in files."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class StartError(RuntimeError):
    """A program did not become ready; the message names it and ends with its log's tail."""


@dataclass
class Proc:
    name: str
    argv: Sequence[str]
    log: Path
    popen: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, env: dict[str, str] | None = None) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = self.log.open("ab")
        try:
            self.popen = subprocess.Popen(list(self.argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)
        finally:
            out.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float) -> float:
        """Poll ``ready`` until it holds; returns the seconds it took. Fails at once if the program exits."""
        start = time.monotonic()
        while True:
            if not self.alive():
                code = self.popen.returncode if self.popen else None
                raise StartError(f"{self.name} exited ({code}) before it was ready; log {self.log}:\n{self.tail()}")
            try:
                if ready():
                    return time.monotonic() - start
            except Exception:  # noqa: BLE001 -- not listening yet is what the poll waits out
                pass
            if time.monotonic() - start > timeout_s:
                raise StartError(f"{self.name} not ready after {timeout_s:.0f} s; log {self.log}:\n{self.tail()}")
            time.sleep(0.1)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after ``grace_s``; waits until it is gone."""
        if self.popen is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if self.popen.poll() is not None:
                break
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.popen.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # anything the program left in its group
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
