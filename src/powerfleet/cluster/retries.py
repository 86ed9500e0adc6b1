"""Reads retried as client-go retries them: a 429 after its ``Retry-After``, a 5xx with a short
backoff, a bounded number of times (the budget tick's and evaluation's reads; docs/cluster.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes.client.exceptions import ApiException

RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})  # a read answered so is tried again
READ_ATTEMPTS = 4
MAX_RETRY_AFTER_S = 5.0  # a longer Retry-After is waited this long (the tick has an interval to keep)
T = TypeVar("T")


def _retry_after(exc: ApiException, attempt: int) -> float:
    """The server's Retry-After (seconds, bounded), else an exponential backoff from 0.1 s."""
    raw = (exc.headers or {}).get("Retry-After")
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(raw))) if raw is not None else 0.1 * 2 ** attempt
    except ValueError:
        return 0.1 * 2 ** attempt


def with_retries(call: Callable[[], T], *, attempts: int = READ_ATTEMPTS,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """A read retried as client-go retries one: on 429 after its ``Retry-After``, and on a 5xx,
    at most ``attempts`` tries in all; any other error, or the last one, is raised."""
    for attempt in range(attempts):
        try:
            return call()
        except ApiException as exc:
            if exc.status not in RETRIED_STATUSES or attempt == attempts - 1:
                raise
            sleep(_retry_after(exc, attempt))
    raise AssertionError("unreachable")  # the loop returns or raises
