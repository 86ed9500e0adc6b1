"""The budget tick's allocations, kept in Redis under a generation (issue 29 item 2, issue 30 route 3).

A control message never carries authority: the tick writes each deployment's group allowance
(budget/program.py ``GroupLimit``) here and sends each evaluation only the generation that wrote
it. An evaluation reads its allowance when it runs and drops itself (a recorded skip, with its
reason) unless its generation is still the newest and fresh, so a late, retried, duplicated or
hand-sent evaluation can never apply an outdated or forged share.

- ``open``: at the start of a tick, before its reads, the generation counter moves to the tick's
  time in milliseconds (or one past the last generation, if the clock is behind it), so every
  evaluation of an earlier tick is outdated from then on, across Redis flushes too (a flushed
  counter restarts at the time, never below an id already sent).
- ``publish``: the tick's allowances, written whole (one Lua script), only if no later tick has
  opened since; otherwise nothing is written and the tick sends no evaluation.
- ``read``: one MULTI read of the counter, the published generation and the deployment's record.
- ``verdict``: the pure rule, a GroupLimit or the reason to skip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from powerfleet.budget.program import GroupLimit

GENERATION = "powerfleet:budget:generation"  # the newest tick's generation (milliseconds since the epoch)
ALLOCATION = "powerfleet:budget:allocation"  # "generation" -> the published one; deployment -> JSON GroupLimit
_PUBLISHED = "generation"

_OPEN = """
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local g = tonumber(ARGV[1])
if g <= last then g = last + 1 end
redis.call('SET', KEYS[1], string.format('%d', g))
return g
"""
_PUBLISH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'generation', ARGV[1])
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
return 1
"""


class _Record(BaseModel):
    """A stored GroupLimit, read strictly: anything else is no allowance."""

    model_config = ConfigDict(extra="forbid", strict=True)
    group: str | None
    limit_w: int | None = Field(ge=0)
    minimum_w: int = Field(ge=0)
    current_w: int = Field(ge=0)
    gpu_capacity: int | None = Field(ge=0)
    admission: str | None = None
    over_share: bool = False


@dataclass(frozen=True)
class Read:
    """What an evaluation of generation ``sent`` found in Redis."""

    sent: int
    newest: int | None  # the counter (None: no tick since the data began)
    published: int | None  # the generation whose allowances are stored
    record: bytes | None  # this deployment's allowance in it


def encode(limit: GroupLimit) -> str:
    return json.dumps(asdict(limit), sort_keys=True)


def decode(raw: bytes) -> GroupLimit | None:
    try:
        return GroupLimit(**_Record.model_validate_json(raw).model_dump())
    except (ValidationError, ValueError, UnicodeDecodeError):
        return None


def _int(raw: bytes | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _superseded(sent: int, newest: int | None) -> str:
    return f"outdated: sent by tick generation {sent}, a later tick ({newest}) has re-divided the budget"


def verdict(got: Read, now: float, max_age_s: float) -> GroupLimit | str:
    """The allowance an evaluation of generation ``got.sent`` may apply, or why it is skipped."""
    if got.newest is None or got.sent > got.newest:
        return f"generation {got.sent} was never opened by a tick (newest: {got.newest}); not applied"
    if got.sent < got.newest:
        return _superseded(got.sent, got.newest)
    if got.published != got.sent:
        return f"tick generation {got.sent} published no allocation (superseded, or the data was lost)"
    age = now - got.sent / 1000.0
    if age > max_age_s:
        return f"stale: tick generation {got.sent} is {age:.0f} s old (more than {max_age_s:.0f} s)"
    if got.record is None:
        return f"not in tick generation {got.sent}'s allocation"
    limit = decode(got.record)
    return limit if limit is not None else f"tick generation {got.sent}'s allocation record is unreadable"


class Allocations:
    def __init__(self, client: redis.Redis) -> None:
        self._r = client
        self._open = client.register_script(_OPEN)
        self._publish = client.register_script(_PUBLISH)

    def open(self, now: float) -> int:
        """A new generation, newer than every one opened before; earlier ticks' evaluations are outdated."""
        return int(self._open(keys=[GENERATION], args=[int(now * 1000)]))

    def publish(self, generation: int, limits: Mapping[str, GroupLimit]) -> bool:
        """Store ``limits`` as generation ``generation``'s, unless a later tick has opened (then False)."""
        args: list[str | int] = [str(generation)]
        for key, limit in limits.items():
            args += [key, encode(limit)]
        return bool(self._publish(keys=[GENERATION, ALLOCATION], args=args))

    def read(self, generation: int, deployment: str) -> Read:
        with self._r.pipeline(transaction=True) as p:
            p.get(GENERATION)
            p.hget(ALLOCATION, _PUBLISHED)
            p.hget(ALLOCATION, deployment)
            newest, published, record = p.execute()
        return Read(generation, _int(newest), _int(published), record)

    def read_all(self) -> tuple[int | None, int | None, dict[str, bytes]]:
        """The counter, the published generation and every deployment's record, in one MULTI (a batch)."""
        with self._r.pipeline(transaction=True) as p:
            p.get(GENERATION)
            p.hgetall(ALLOCATION)
            newest, stored = p.execute()
        records = {k.decode(): v for k, v in stored.items() if k != _PUBLISHED.encode()}
        return _int(newest), _int(stored.get(_PUBLISHED.encode())), records

    def outdated(self, generation: int) -> str | None:
        """Why generation ``generation`` may no longer write (None: it is still the newest)."""
        newest = _int(self._r.get(GENERATION))
        return None if newest == generation else _superseded(generation, newest)
