"""TickLog: the record in Redis of the last tick of each family, read by `powerfleet status`."""

from __future__ import annotations

import redis

_LAST = "powerfleet:ticks:last"
_DETAIL = "powerfleet:ticks:detail"
_COUNT = "powerfleet:ticks:count"
_ORIGINS = "powerfleet:ticks:origins:{family}"
_KEEP = 200


class TickLog:
    def __init__(self, client: redis.Redis) -> None:
        self._r = client

    def record(self, family: str, at: float, origin: str | None, detail: str = "") -> None:
        """Remember that a tick of ``family`` ran at ``at``, which process sent it, and what it did."""
        key = _ORIGINS.format(family=family)
        with self._r.pipeline() as p:
            p.hset(_LAST, family, repr(at))
            p.hset(_DETAIL, family, detail)
            p.hincrby(_COUNT, family, 1)
            p.lpush(key, origin or "unknown")
            p.ltrim(key, 0, _KEEP - 1)
            p.execute()

    def last_ticks(self) -> dict[str, float]:
        raw = self._r.hgetall(_LAST)
        return {k.decode(): float(v) for k, v in raw.items()}

    def last_details(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self._r.hgetall(_DETAIL).items()}

    def counts(self) -> dict[str, int]:
        """Ticks run per family since the broker's data began (not capped like origins)."""
        return {k.decode(): int(v) for k, v in self._r.hgetall(_COUNT).items()}

    def origins(self, family: str) -> list[str]:
        return [o.decode() for o in self._r.lrange(_ORIGINS.format(family=family), 0, -1)]
