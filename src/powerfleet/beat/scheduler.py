"""Beat's scheduler: RedBeat, kept alive through a broker outage.

RedBeat extends its Redis lock on every tick; when Redis is unreachable that raises, and
Celery's beat service exits with a chained traceback dozens of lines long. A lost broker
is an outage to wait out, not a crash: this scheduler logs one warning per retry and ticks
again. When Redis returns without our lock (it restarted empty, or the outage outlasted
the lock), another beat may already lead, so this one re-takes the lock without blocking
and stands by until it holds it again: never two leaders.

A standby beat waits for the lock inside RedBeat's ``beat_init`` handler; a broker failover
during that wait makes the blocking acquire raise, Celery swallows it and beat starts with no
lock at all (``scheduler.lock`` None), whose first tick used to die on ``self.lock.extend``
(issue 31 finding 7). Such a beat stands by like one that lost its lock: it builds the lock
RedBeat would have and takes it without blocking when it is free.

A SIGTERM or Ctrl-C that lands inside a pass (a tick's publish blocked on Redis) used to raise
SystemExit in the middle of the socket read; kombu then retried the publish on a torn connection
and beat logged a traceback while stopping (seen in CI: `up`'s Ctrl-C). ``FleetBeat`` defers such
a stop to the end of the pass: the tick in hand is sent, then beat stops as it would between passes.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redbeat import RedBeatScheduler
from redbeat.schedulers import LUA_EXTEND_TO_SCRIPT, get_redis

from powerfleet.broker.follow import follow_switches
from powerfleet.broker.metrics import reconnects
from powerfleet.workers.logging import one_line

logger = logging.getLogger("powerfleet.beat")
BROKER_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
BROKER_RETRY_S = 1.0  # how soon beat tries again while the broker is unreachable


class FleetScheduler(RedBeatScheduler):
    _standing_by = False
    _broker_lost = False
    _in_pass = False
    _stop_requested = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        reconnects()  # the series exists, at 0, from the start
        super().__init__(*args, **kwargs)
        follow_switches(self.app.conf.broker_url, self.app.fleet_config.broker)

    def request_stop(self) -> bool:
        """From beat's SIGTERM/SIGINT handler: True if beat may stop now, False if a pass is in
        flight (it stops when the pass ends, its publishes complete)."""
        self._stop_requested = True
        return not self._in_pass

    def tick(self, min: Any = min, **kwargs: Any) -> float:
        self._in_pass = True
        try:
            return self._tick(min, **kwargs)
        finally:
            self._in_pass = False
            if self._stop_requested:
                raise SystemExit()  # Service.start catches it, syncs and releases the lock

    def _tick(self, min: Any, **kwargs: Any) -> float:
        retry_s = float(self.max_interval)
        try:
            if self.lock_key and self.lock is None and not self._standing_by:
                logger.warning("beat: started without the RedBeat lock (the broker failed over while it waited); "
                               "standing by until it is free, retrying every %gs", retry_s)
                self._standing_by = True
            if self._standing_by and not self._retake_lock():
                return retry_s
            next_s = super().tick(min=min, **kwargs)
            if self._broker_lost:
                self._broker_lost = False
                reconnects().labels(kind="consumer").inc()
            return next_s
        except LockError:
            logger.warning("beat: lost the RedBeat lock (Redis restarted or the outage outlasted it); "
                           "standing by until it is free, retrying every %gs", retry_s)
            self._standing_by = True
            return retry_s
        except BROKER_ERRORS as exc:
            # Retry within a second, not after max_interval (5 s): after a failover the ticks resume
            # within the promotion time plus a second (issue 31 finding 8), one warning per retry.
            self._broker_lost = True
            retry_s = min(retry_s, BROKER_RETRY_S)
            logger.warning("beat: broker unreachable (%s); retrying in %gs", one_line(exc), retry_s)
            return retry_s

    def _retake_lock(self) -> bool:
        if self.lock is None:
            self.lock = self._new_lock()
        if not self.lock.acquire(blocking=False):
            return False
        # A Redis that lost our lock may have lost the schedule too (it restarted empty):
        # write the static entries again, as at start-up (idempotent).
        self.setup_schedule()
        logger.warning("beat: holds the RedBeat lock again; ticking")
        self._standing_by = False
        return True

    def _new_lock(self) -> Any:
        """The lock RedBeat's ``beat_init`` handler builds (its extend script included)."""
        client = get_redis(self.app)
        lock = client.lock(self.lock_key, timeout=self.lock_timeout, sleep=self.max_interval)
        lock.lua_extend = client.register_script(LUA_EXTEND_TO_SCRIPT)
        return lock

    def close(self) -> None:
        try:
            super().close()
        except (LockError, *BROKER_ERRORS) as exc:
            # The lock expires on its own; nothing else to release without a broker.
            logger.warning("beat: could not release the RedBeat lock at exit (%s)", one_line(exc))
            self.lock = None
