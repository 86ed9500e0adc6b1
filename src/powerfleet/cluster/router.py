"""The frontends' router admin endpoint (``GET``/``PATCH /router_policy``) over httpx.

One call per method; every failure becomes a one-line ``RouterError`` naming the frontend,
and a stale revision on PATCH becomes ``RevisionConflict`` (the caller re-reads and retries
once). The endpoint is unauthenticated on the frontend (docs/retune.md says how to fence it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import httpx

from powerfleet.sim.policy import POLICY_FIELDS

TIMEOUT_S = 8.0


class RouterError(Exception):
    """A frontend could not be read or written (transport, status or a malformed answer)."""


class RevisionConflict(RouterError):
    """PATCH carried a revision the frontend no longer has."""


@dataclass(frozen=True)
class RouterPolicyState:
    revision: int
    policy: dict[str, float]


def parse_answer(url: str, resp: httpx.Response) -> RouterPolicyState:
    try:
        body = resp.json()
    except ValueError:
        raise RouterError(f"{url}: answer is not JSON") from None
    rev = body.get("revision") if isinstance(body, dict) else None
    pol = body.get("policy") if isinstance(body, dict) else None
    if isinstance(rev, bool) or not isinstance(rev, int) or not isinstance(pol, dict):
        raise RouterError(f"{url}: answer lacks an integer revision and a policy object")
    out: dict[str, float] = {}
    for k in POLICY_FIELDS:
        v = pol.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RouterError(f"{url}: policy.{k} is missing or not a finite number")
        out[k] = float(v)
    return RouterPolicyState(rev, out)


class RouterClient:
    """GET/PATCH ``/router_policy`` on frontends; ``leader`` is sent so frontends can log who wrote."""

    def __init__(self, *, timeout_s: float = TIMEOUT_S, leader: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"X-Powerfleet-Leader": leader} if leader else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, base_url: str) -> RouterPolicyState:
        url = base_url.rstrip("/") + "/router_policy"
        try:
            resp = self._http.get(url)
        except httpx.HTTPError as exc:
            raise RouterError(f"{url}: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise RouterError(f"{url}: GET answered HTTP {resp.status_code}")
        return parse_answer(url, resp)

    def patch(self, base_url: str, policy: dict[str, Any], revision: int) -> RouterPolicyState:
        url = base_url.rstrip("/") + "/router_policy"
        try:
            resp = self._http.patch(url, json={"revision": revision, "policy": policy})
        except httpx.HTTPError as exc:
            raise RouterError(f"{url}: {type(exc).__name__}: {exc}") from None
        if resp.status_code == 409:
            raise RevisionConflict(f"{url}: revision {revision} is stale")
        if resp.status_code != 200:
            raise RouterError(f"{url}: PATCH answered HTTP {resp.status_code}")
        return parse_answer(url, resp)
