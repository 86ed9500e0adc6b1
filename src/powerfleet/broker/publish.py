"""Publishing through a master that refuses writes with NOREPLICAS.

With ``min-replicas-to-write`` (the chart's Sentinel mode) a master without an up-to-date
replica refuses every write, so that a failover cannot lose what it acknowledged. Neither
kombu nor Celery's publish retry treats that as recoverable (it is a ResponseError, not a
connection error), so a tick or a fan-out would fail at once. A replica that resyncs comes back
in seconds: retry for ``broker.noreplicas_retry_s``, then raise one line that says why.

The same refusal reaches readers too: a worker's BRPOP is a write (it pops). As a plain
ResponseError it crashed the consumer, and the worker with it, the moment a promoted master
had no replica in sync yet (seconds into every failover with the chart's min-replicas-to-write).
``noreplicas_is_unavailable`` makes redis-py raise ``NoReplicas``, a ConnectionError: Celery and
kombu then reconnect as after any broker outage, and redis-py's own retry covers a direct
client's write (a refused command did not run, so retrying is safe). It is deliberately not a
ResponseError as well: redis-py drops the connection on a ConnectionError from the parser, and a
transaction (kombu binds a queue in one) collects ResponseErrors per command and reads on, from
the closed socket.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

import redis
from redis._parsers.base import BaseParser

from powerfleet.clock import Clock, SystemClock

T = TypeVar("T")
logger = logging.getLogger("powerfleet.broker")
_FIRST_PAUSE_S = 0.1
_MAX_PAUSE_S = 1.0


class BrokerRefusedWrite(Exception):
    """The master kept refusing writes (NOREPLICAS) for the whole retry period."""


class NoReplicas(redis.ConnectionError):
    """NOREPLICAS: the master takes no write until enough replicas are in sync again."""


def noreplicas_is_unavailable() -> None:
    """Have redis-py raise NoReplicas for NOREPLICAS in this process (see the module docstring)."""
    BaseParser.EXCEPTION_CLASSES.setdefault("NOREPLICAS", NoReplicas)


def is_noreplicas(exc: BaseException | None) -> bool:
    """The master's NOREPLICAS refusal, as redis-py raises it or as kombu wraps it
    (an OperationalError "Command # 1 (...) of pipeline caused error: NOREPLICAS ...")."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, NoReplicas) or (isinstance(exc, redis.ResponseError) and "NOREPLICAS" in str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def retry_noreplicas(publish: Callable[[], T], what: str, retry_s: float,
                     clock: Clock | None = None, sleep: Callable[[float], None] = time.sleep) -> T:
    """``publish()``, retried while the master answers NOREPLICAS, for at most ``retry_s``."""
    clock = clock or SystemClock()
    deadline = clock.monotonic() + retry_s
    pause, tries = _FIRST_PAUSE_S, 0
    while True:
        try:
            return publish()
        except Exception as exc:  # noqa: BLE001 - only NOREPLICAS is retried, the rest re-raised
            if not is_noreplicas(exc):
                raise
            tries += 1
            left = deadline - clock.monotonic()
            if left <= 0:
                raise BrokerRefusedWrite(
                    f"{what}: the Redis master refused the write {tries} times in {retry_s:g}s (NOREPLICAS: "
                    "fewer replicas in sync than min-replicas-to-write); check the replicas' master_link_status"
                ) from None
            if tries == 1:
                logger.warning("%s: Redis master refused the write (NOREPLICAS); retrying for up to %gs", what, retry_s)
            sleep(min(pause, left))
            pause = min(pause * 2, _MAX_PAUSE_S)
