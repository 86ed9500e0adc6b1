"""Chunked LISTs: ``limit`` and ``continue``, as kube-apiserver serves them.

A LIST with ``limit`` answers at most that many items and, when more remain,
``metadata.continue`` (an opaque token) and ``metadata.remainingItemCount``. Every later page of
that list comes from the same snapshot as the first (a real server reads etcd at the first
page's revision), so a client paging through sees one consistent list at one resourceVersion. A
token older than ``ttl_s`` (etcd's compaction, every 5 minutes by default) or one the server no
longer has (``expire``, or a restarted server) answers **410 Gone**, reason ``Expired``, with the
real server's message: the client must start a new list. A malformed token is 400.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import threading
from collections.abc import Sequence

from powerfleet.clock import Clock
from powerfleet.twin.apiserver.errors import ApiError, Obj

DEFAULT_TTL_S = 300.0
_EXPIRED = ("The provided continue parameter is too old to display a consistent list result. You can start a "
            "new list without the continue parameter.")


def parse_limit(raw: str | None) -> int | None:
    """``limit`` as the server reads it: absent, 0 or negative -> no limit; not an integer -> 400."""
    if raw is None or raw == "":
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid limit {raw!r}: not an integer") from None
    return n if n > 0 else None


class Pages:
    def __init__(self, clock: Clock, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.clock, self.ttl_s = clock, ttl_s
        self._lock = threading.Lock()
        self._lists: dict[int, tuple[float, int, list[Obj]]] = {}  # id -> (first page at, rv, items)
        self._ids = itertools.count(1)

    def page(self, items: Sequence[Obj], rv: int, limit: int | None, token: str | None,
             selected: bool = False) -> tuple[list[Obj], Obj]:
        """The items of this page and the list's metadata. ``items``/``rv``: what a new list reads now
        (ignored when ``token`` continues an earlier one). ``selected``: the list has a label or field
        selector, under which the real server cannot count what remains (no ``remainingItemCount``)."""
        now = self.clock.now()
        with self._lock:
            self._expire(now)
            if token:
                list_id, start = self._decode(token)
                if list_id not in self._lists:
                    raise ApiError(410, "Expired", _EXPIRED)
                at, rv, snapshot = self._lists[list_id]
            else:
                if limit is None or len(items) <= limit:
                    return list(items), {"resourceVersion": str(rv)}
                list_id, start, at, snapshot = next(self._ids), 0, now, list(items)
                self._lists[list_id] = (at, rv, snapshot)
            end = len(snapshot) if limit is None else min(len(snapshot), start + limit)
            meta: Obj = {"resourceVersion": str(rv)}
            if end < len(snapshot):
                meta["continue"] = self._encode(list_id, end, rv)
                if not selected:
                    meta["remainingItemCount"] = len(snapshot) - end
            else:
                self._lists.pop(list_id, None)  # the last page: nothing more to serve from it
            return snapshot[start:end], meta

    def expire(self) -> None:
        """Forget every list being paged (a compaction): their tokens answer 410 from now on."""
        with self._lock:
            self._lists.clear()

    def _expire(self, now: float) -> None:
        for list_id in [i for i, (at, _, _) in self._lists.items() if now - at > self.ttl_s]:
            del self._lists[list_id]

    @staticmethod
    def _encode(list_id: int, start: int, rv: int) -> str:
        raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "id": list_id, "start": start}).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def _decode(token: str) -> tuple[int, int]:
        try:
            got = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            list_id, start = got["id"], got["start"]
            if type(list_id) is int and type(start) is int and start >= 0:
                return list_id, start
        except (ValueError, KeyError, TypeError, binascii.Error):
            pass
        raise ApiError(400, "BadRequest", "continue key is not valid")
