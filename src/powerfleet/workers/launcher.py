"""Launcher: starts the processes of a fleet on one machine and stops them in order.

Used by `powerfleet up` / `demo` and by the integration tests, so the tests exercise the
same process tree users run. Each child is `python -m powerfleet.cli ...` in its own
session (so a terminal's Ctrl-C reaches only us, and we stop children in order) with its
output in ``log_dir/<name>.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from powerfleet.broker.embedded import EmbeddedRedis


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    args: tuple[str, ...] = ()  # what it was started with, for respawn
    env: dict[str, str] | None = None


@dataclass
class Launcher:
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    redis: EmbeddedRedis | None = None
    # Run in each child (Redis included) before it execs: `up` gives one that has the kernel stop
    # its children when it dies (cli/up_children.py).
    preexec: Callable[[], None] | None = None

    def start_embedded_broker(self) -> str:
        self.redis = EmbeddedRedis(preexec=self.preexec).start()
        self.env["POWERFLEET_BROKER__URL"] = self.redis.url
        return self.redis.url

    def child_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env.update(extra or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def spawn(self, name: str, *cli_args: str, env: dict[str, str] | None = None) -> Child:
        """Start ``powerfleet <cli_args>``; ``env`` adds variables for this child only."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "powerfleet.cli", *cli_args], env=self.child_env(env),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=self.preexec)
        child = Child(name, proc, log, tuple(cli_args), env)
        self.children.append(child)
        return child

    def respawn(self, child: Child) -> Child:
        """Start a child that stopped again, as it was started (its log appended to)."""
        if child in self.children:
            self.children.remove(child)
        return self.spawn(child.name, *child.args, env=child.env)

    def dead_children(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is not None]

    def stop_child(self, child: Child, timeout_s: float = 20.0) -> int:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)  # warm shutdown: running tasks finish
            try:
                child.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
        if child in self.children:
            self.children.remove(child)
        return int(child.proc.returncode)

    def stop(self, timeout_s: float = 20.0) -> None:
        # Beat first (no new ticks), then workers, agents and Flower together (each finishes its
        # own task; waiting on them one by one made a demo's stop take ~40 s), then the broker.
        for child in [c for c in self.children if c.name == "beat"]:
            self.stop_child(child, timeout_s)
        rest = list(self.children)
        for child in rest:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in rest:
            self.stop_child(child, max(0.1, deadline - time.monotonic()))
        if self.redis is not None:
            self.redis.close()
            self.redis = None

    def __enter__(self) -> "Launcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
