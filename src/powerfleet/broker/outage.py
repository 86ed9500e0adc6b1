"""What a task and its result meet when the broker's Redis goes away mid-task: one line, no traceback.

The fleet's tasks and their results live on the broker's Redis (or a result backend of the same
kind). When it stops, fails over or is restarted, a task running at that moment loses it twice:

- its body's next Redis call (a tick log, an agent's heartbeat scan, a publish) raises
  ``redis.exceptions.ConnectionError`` and Celery logs "raised unexpected" with a traceback;
- storing its result (success or failure) raises too: Celery 5.7's Redis backend reads the
  stored meta first (``_get_task_meta_for``, not retried) and retries only its ``SET``, logging
  each retry at ERROR; when that fails, the pool logs "Exception raised outside body" with a
  traceback and the parent "Task handler raised error" with another.

Seen in a clean-clone run (tests/integration/test_broker_restart.py): a reconcile tick running at
the moment the broker stopped. Here instead:

- ``FleetTask`` (workers/outcomes.py) turns a body's Redis connection error into
  ``RedisUnreachable``, an expected error of every fleet task: Celery records FAILURE and logs it
  without a traceback, and the fleet logs one WARNING line naming the task;
- ``FleetRedisBackend`` / ``FleetSentinelBackend`` (what ``redis://``, ``rediss://`` and
  ``sentinel://`` result backends resolve to in the fleet's app: ``fleet_result_backends``) wait
  out a short outage storing a result, one WARNING line per try, and after ``STORE_DELAYS_S``
  (about 15 s: a Sentinel failover takes 2-5 s, docs/benchmarks.md table C) drop it with one
  more line. A client waiting on that result times out as it would for a lost message; the
  fleet's ticks and passes are re-sent by beat, so nothing waits on them.

The wait runs in the pool process, which could take no new task anyway while the broker is gone;
15 s stays inside every family's hard time limit less its soft one (config/processes.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import redis
from celery.backends.redis import RedisBackend, SentinelBackend
from kombu.exceptions import OperationalError

logger = logging.getLogger("powerfleet.broker")

# What "Redis went away" looks like from a task body: a dropped or refused connection, a socket
# timeout (a frozen master), a Sentinel with no master (MasterNotFoundError is a ConnectionError),
# kombu giving up a publish after its retries.
REDIS_UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OperationalError)

# Seconds between a result's store tries; after the last, it is dropped (sum: 15 s).
STORE_DELAYS_S: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0)


class RedisUnreachable(ConnectionError):
    """A fleet task's body lost the broker's Redis mid-task; the task failed and did nothing more."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def unreachable(task_name: str, exc: BaseException) -> RedisUnreachable:
    """The error a fleet task raises for ``exc`` (one of REDIS_UNREACHABLE_ERRORS), logged once."""
    logger.warning("%s: the broker's Redis became unreachable mid-task (%s); the task failed", task_name,
                   first_line(exc))
    return RedisUnreachable(f"{task_name}: the broker's Redis became unreachable mid-task ({first_line(exc)})")


class StoresThroughOutages:
    """A Celery Redis result backend whose store waits out a short outage in one line per try.

    Celery's own retries are switched off here (``retry_policy``: no retry of the SET, whose
    every retry it logs at ERROR) so that this is the one loop, around the whole store (the meta
    read included)."""

    connection_errors: tuple[type[BaseException], ...]
    sleep: Callable[[float], None] = staticmethod(time.sleep)
    delays_s: tuple[float, ...] = STORE_DELAYS_S

    @property
    def retry_policy(self) -> dict[str, Any]:
        return {"max_retries": 0, "interval_start": 0, "interval_step": 0, "interval_max": 0}

    def store_result(self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None,
                     **kwargs: Any) -> Any:
        name = getattr(request, "task", None) or "a task"
        for attempt, delay in enumerate((*self.delays_s, None), start=1):
            try:
                return super().store_result(  # type: ignore[misc]
                    task_id, result, state, traceback=traceback, request=request, **kwargs)
            except self.connection_errors as exc:
                if delay is None:
                    logger.warning("results: %s[%s] %s not stored, dropped: Redis unreachable after %d tries "
                                   "over %.0f s (%s)", name, task_id, state, attempt, sum(self.delays_s),
                                   first_line(exc))
                    return result
                logger.warning("results: %s[%s] %s not stored yet: Redis unreachable (%s); try %d of %d in "
                               "%.1f s", name, task_id, state, first_line(exc), attempt + 1,
                               len(self.delays_s) + 1, delay)
                self.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns on its last try


class FleetRedisBackend(StoresThroughOutages, RedisBackend):
    """Celery's Redis result backend, storing through a short outage (module doc)."""


class FleetSentinelBackend(StoresThroughOutages, SentinelBackend):
    """Celery's Sentinel result backend, storing through a failover (module doc)."""


def fleet_result_backends() -> dict[str, str]:
    """The app loader's ``override_backends``: result backend URL schemes to the fleet's classes.
    Per app (the loader's), so the scheme, and every reader of the URL, stay as they are."""
    return {"redis": f"{__name__}:FleetRedisBackend", "rediss": f"{__name__}:FleetRedisBackend",
            "sentinel": f"{__name__}:FleetSentinelBackend"}
