"""Waiting on states with a deadline: the tests' and benchmarks' only way to synchronise with
other processes (``wait_for``), and a worker answering ping (``wait_worker``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from powerfleet.workers.app import FleetCelery

T = TypeVar("T")


def wait_for(probe: Callable[[], T], what: str, timeout_s: float = 30.0, every_s: float = 0.05) -> T:
    """Return probe()'s first truthy value; fail with ``what`` if none comes before the deadline.

    The failure names what the last try did. An error from an earlier try is reported as that,
    with how many tries raised: issue 31's quarantined failover test was read as "ConnectionError
    on each try" when one ping, on a connection to the killed master, had raised and every later
    one had returned no answer.
    """
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    tries = raised = 0
    while True:
        tries += 1
        try:
            value = probe()
            if value:
                return value
            last: str = f"returned {value!r}"
        except Exception as exc:  # the state may be unreadable until the process is up
            last_exc, raised = exc, raised + 1
            last = f"raised {exc!r}"
        if time.monotonic() >= deadline:
            detail = f"last try {last}"
            if last_exc is not None and not last.startswith("raised"):
                detail += f"; {raised} of {tries} tries raised, the last of them {last_exc!r}"
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} ({detail})")
        time.sleep(every_s)


def wait_worker(app: FleetCelery, name: str, timeout_s: float = 60.0) -> None:
    """Wait until the worker ``name`` answers a ping through ``app``'s broker."""
    wait_for(lambda: app.control.ping(destination=[name], timeout=0.5), f"worker {name} to answer ping", timeout_s)
