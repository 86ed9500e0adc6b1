"""Waiting on states with a deadline: the tests' only way to synchronise with other processes."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

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
