"""Faults the loopback server can be told to inject (a fidelity switch, docs/twin.md): what a loaded
real API server does to its clients, so that their retry paths run.

- ``rates(throttle=, error=)``: answer that share of the matching requests 429 TooManyRequests with
  ``Retry-After`` (API Priority and Fairness rejecting a request) or a 5xx (500/503/504 in turn:
  an etcd timeout, a restarting server), chosen by a seeded random stream so a run repeats;
- ``hold(method, path)``: hold the next matching request until released (a slow server, or a
  client paused mid-call), so a test can order what two processes do.

Off by default: a server built without faults answers every request.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field

from powerfleet.twin.apiserver.errors import ApiError

_ERRORS = ((500, "InternalError", "etcdserver: request timed out"),
           (503, "ServiceUnavailable", "the server is currently unable to handle the request"),
           (504, "Timeout", "the server was unable to return a response in the time allotted"))


@dataclass
class Hold:
    method: str
    path: str  # a substring of the request path
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


class Faults:
    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._throttle = self._error = 0.0
        self._retry_after_s = 1
        self._methods: frozenset[str] | None = None
        self._holds: list[Hold] = []
        self.served: Counter[int] = Counter()  # status code -> injected answers

    def rates(self, *, throttle: float = 0.0, error: float = 0.0, retry_after_s: int = 1,
              methods: frozenset[str] | None = None, seed: int | None = None) -> None:
        """Answer ``throttle`` of the requests 429 and ``error`` of them 5xx (``methods``: only those; None: all)."""
        if not (0.0 <= throttle and 0.0 <= error and throttle + error <= 1.0):
            raise ValueError("throttle and error are shares of the requests: each >= 0, together <= 1")
        with self._lock:
            self._throttle, self._error, self._retry_after_s, self._methods = throttle, error, retry_after_s, methods
            if seed is not None:
                self._rng.seed(seed)

    def hold(self, method: str, path: str) -> Hold:
        """Hold the next ``method`` request whose path contains ``path`` until ``release()``."""
        h = Hold(method, path)
        with self._lock:
            self._holds.append(h)
        return h

    def before(self, method: str, path: str) -> None:
        """Called before a request is served: may block on a hold, or raise the injected answer."""
        with self._lock:
            held = next((h for h in self._holds if h.method == method and h.path in path), None)
            if held is not None:
                self._holds.remove(held)
            draw = self._rng.random() if self._methods is None or method in self._methods else 1.0
            throttle, error, retry_after = self._throttle, self._error, self._retry_after_s
        if held is not None:
            held.reached.set()
            held.released.wait()
        if draw < throttle:
            self._count(429)
            raise ApiError(429, "TooManyRequests", "Too many requests, please try again later.",
                           {"retryAfterSeconds": retry_after}, headers=(("Retry-After", str(retry_after)),))
        if draw < throttle + error:
            code, reason, message = _ERRORS[int((draw - throttle) / error * len(_ERRORS)) % len(_ERRORS)]
            self._count(code)
            raise ApiError(code, reason, message)

    def _count(self, code: int) -> None:
        with self._lock:
            self.served[code] += 1
