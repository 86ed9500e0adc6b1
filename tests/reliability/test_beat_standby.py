"""A standby beat that starts without the RedBeat lock (issue 31 finding 7: the broker failed over while it
waited in RedBeat's blocking acquire, Celery swallowed the error, and the first tick died on
``self.lock.extend`` with AttributeError, exiting beat). Real redis-server, the fleet's own scheduler."""

from __future__ import annotations

import redis

from powerfleet.beat.scheduler import FleetScheduler
from powerfleet.config import load_config
from powerfleet.workers.app import create_app
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures


def test_a_beat_started_without_its_lock_stands_by_then_leads_once_the_lock_is_free(broker_url: str) -> None:  # noqa: F811
    app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": broker_url}))
    r = redis.Redis.from_url(broker_url)
    sched = FleetScheduler(app=app)
    assert sched.lock_key and sched.lock is None  # as beat_init leaves it when the acquire raised
    r.set(sched.lock_key, "the other beat", px=60_000)  # the new leader holds it
    wait = sched.tick()  # no AttributeError: it stands by
    assert wait == float(sched.max_interval) and sched._standing_by, (wait, sched._standing_by)
    assert r.get(sched.lock_key) == b"the other beat"  # never two leaders
    assert sched.tick() == float(sched.max_interval)
    r.delete(sched.lock_key)  # the leader is gone and its lock expired
    sched.tick()
    assert not sched._standing_by and sched.lock is not None and sched.lock.owned()
    token = r.get(sched.lock_key)
    sched.tick()  # leading: it extends its own lock (RedBeat's extend script) and keeps it
    assert r.get(sched.lock_key) == token and 0 < r.pttl(sched.lock_key) <= sched.lock_timeout * 1000
    sched.close()
    assert r.get(sched.lock_key) is None


def test_a_beat_that_lost_its_broker_tries_again_within_a_second(broker_url: str, redis_server) -> None:  # noqa: F811
    # issue 31 finding 8: beat retried every max_interval (5 s), so ticks resumed 5-7 s after a promotion
    app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": broker_url}))
    sched = FleetScheduler(app=app)
    sched._retake_lock()
    assert sched.lock is not None and sched.lock.owned()
    assert float(sched.max_interval) == 5.0
    redis_server.close()  # the broker gone: every command fails to connect
    waits = [sched.tick() for _ in range(2)]
    assert all(w <= 1.0 for w in waits) and sched._broker_lost, waits
