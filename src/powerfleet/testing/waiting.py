"""Waiting on states with a deadline: the tests' and benchmarks' only way to synchronise with
other processes (``wait_for``), and a worker answering ping (``wait_worker``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from powerfleet.workers.app import FleetCelery

T = TypeVar("T")


def wait_for(probe: Callable[[], T], what: str, timeout_s: float = 30.0, every_s: float = 0.05) -> T:
    """Return probe()'s first truthy value; fail with ``what`` if none comes before the deadline."""
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # the state may be unreadable until the process is up
            last_exc = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}" +
                                 (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(every_s)


def wait_worker(app: FleetCelery, name: str, timeout_s: float = 60.0) -> None:
    """Wait until the worker ``name`` answers a ping through ``app``'s broker."""
    wait_for(lambda: app.control.ping(destination=[name], timeout=0.5), f"worker {name} to answer ping", timeout_s)
