"""What a refused PATCH means (issue 18 item 6).

A 422 answers two different things: a JSON patch whose ``test`` failed (the object changed
since it was read: a conflict, re-planned at the next evaluation) and a write the server
refused (its schema, a CEL rule, an admission webhook: an error, reported with the server's
message, that repeating the same write will not cure). Only the first is a ``Conflict``.
"""

from __future__ import annotations

import json
import re

from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.ports import ClusterError, Conflict

# kube-apiserver (evanphx/json-patch): "testing value /spec/... failed"; the loopback server:
# "test failed at '/spec/...'".
_TEST_FAILED = re.compile(r"testing value \S* ?failed|test failed|test operation", re.IGNORECASE)


class Rejected(ClusterError):
    """The server refused the write (422 from a schema, CEL rule or webhook); ``str`` holds its message."""


def server_message(exc: ApiException) -> str:
    """The Status message the server sent, else its HTTP reason (one line)."""
    try:
        body = json.loads(exc.body or "")
        message = body.get("message") if isinstance(body, dict) else None
    except (TypeError, ValueError):
        message = None
    return " ".join(str(message or exc.reason or "").split())


def raise_for_patch(what: str, exc: ApiException, tested_paths: tuple[str, ...] = ()) -> None:
    """Raise Conflict for a failed ``test``, Rejected for any other 422; re-raise anything else.

    ``tested_paths``: the paths the patch's ``test`` ops guard. A 422 that names one of them is a
    conflict too: the JSON patch library behind kube-apiserver words a test on a path that no
    longer exists (a list that got shorter) as an index or missing-path error, not as a failed test.
    """
    if exc.status != 422:
        raise exc
    message = server_message(exc)
    if _TEST_FAILED.search(message) or any(p in message for p in tested_paths):
        raise Conflict(f"{what}: the object changed since it was read ({message})", status=409) from exc
    raise Rejected(f"{what}: HTTP 422 rejected by the server: {message}", status=422) from exc
