"""The API server's error type: an exception that renders as a Kubernetes ``Status`` object."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None,
                 headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.headers = tuple(headers)  # e.g. Retry-After on a 429
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        return {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "details": self.details, "code": self.code,
        }
