"""A task running when the broker's Redis goes away: it fails in one line, its result waits out the
outage, and nothing logs a traceback (broker/outage.py).

Seen in a clean-clone run: test_broker_restart's outage test found a Traceback in the worker's log.
A reconcile tick had been running as the broker stopped; its body's Redis call raised, then storing
its FAILURE raised too (Celery's Redis backend reads the old meta first, unretried), and the pool
logged both with tracebacks. Here the kill lands inside a tick on purpose: its agent-presence SCAN
walks a million filler keys (about a second), and the server is SIGKILLed as soon as the worker logs
the tick's receipt.
"""

from __future__ import annotations

import json
import logging

import pytest
import redis
from celery.app.task import Context
from celery.backends.redis import RedisBackend

from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.broker.outage import STORE_DELAYS_S, FleetRedisBackend, RedisUnreachable
from powerfleet.config import load_config
from powerfleet.testing.redisproc import restartable_redis
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher
from powerfleet.workers.outcomes import FleetTask
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

FILLER_KEYS = 1_000_000


def _app(server: EmbeddedRedis):
    return create_app(load_config(environ={"POWERFLEET_BROKER__URL": server.url, "POWERFLEET_NODES": "[]"}))


def _stored(server: EmbeddedRedis, task_id: str) -> dict | None:
    raw = redis.Redis.from_url(server.url).get(f"celery-task-meta-{task_id}")
    return json.loads(raw) if raw else None


def test_redis_result_urls_resolve_to_the_fleets_backend_and_keep_their_scheme() -> None:
    with EmbeddedRedis() as server:
        app = _app(server)
        assert isinstance(app.backend, FleetRedisBackend)
        assert app.conf.result_backend.startswith("redis://")
        assert app.backend.retry_policy["max_retries"] == 0  # the store's own loop is the only one


def test_a_result_stored_during_an_outage_lands_once_redis_is_back(caplog: pytest.LogCaptureFixture) -> None:
    with restartable_redis() as server:
        backend = _app(server).backend
        server.kill()
        waits: list[float] = []

        def sleep(s: float) -> None:  # the outage ends during the second wait
            waits.append(s)
            if len(waits) == 2:
                server.start()

        backend.sleep = sleep
        with caplog.at_level(logging.WARNING, logger="powerfleet.broker"):
            backend.store_result("t-1", {"ok": 1}, "SUCCESS", request=Context(task="powerfleet.fleet.echo"))
        assert waits == list(STORE_DELAYS_S[:2])
        meta = _stored(server, "t-1")
        assert meta is not None and meta["status"] == "SUCCESS" and meta["result"] == {"ok": 1}, meta
        lines = [r for r in caplog.records if r.name == "powerfleet.broker"]
        assert [r.levelno for r in lines] == [logging.WARNING] * 2, [r.getMessage() for r in lines]
        assert all(r.exc_info is None and "powerfleet.fleet.echo[t-1] SUCCESS not stored yet" in r.getMessage()
                   for r in lines), [r.getMessage() for r in lines]


def test_a_result_that_cannot_be_stored_is_dropped_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with restartable_redis() as server:
        app = _app(server)
        backend = app.backend
        server.kill()
        waits: list[float] = []
        backend.sleep = waits.append
        with caplog.at_level(logging.WARNING, logger="powerfleet.broker"):
            backend.store_result("t-2", None, "FAILURE", request=Context(task="powerfleet.fleet.reconcile"))
        assert waits == list(STORE_DELAYS_S)
        lines = [r.getMessage() for r in caplog.records if r.name == "powerfleet.broker"]
        assert len(lines) == len(STORE_DELAYS_S) + 1 and "not stored, dropped" in lines[-1], lines
        assert all(r.exc_info is None for r in caplog.records)
        # Celery's own backend raises on the same dead server: the pool's "raised outside body" traceback
        with pytest.raises(redis.exceptions.ConnectionError):
            RedisBackend(app=app, url=server.url).store_result("t-3", None, "FAILURE")


def test_a_fleet_tasks_lost_redis_is_an_expected_failure_naming_the_task(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": "redis://127.0.0.1:1/0"}), with_tasks=False)

    @app.task(name="powerfleet.test.lost", shared=False)
    def lost() -> None:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    assert isinstance(lost, FleetTask) and RedisUnreachable in lost.throws
    with caplog.at_level(logging.WARNING, logger="powerfleet.broker"), pytest.raises(RedisUnreachable) as got:
        lost()
    assert "powerfleet.test.lost" in str(got.value) and "Connection refused" in str(got.value)
    assert [r.getMessage() for r in caplog.records if r.name == "powerfleet.broker"] == [
        "powerfleet.test.lost: the broker's Redis became unreachable mid-task (ConnectionError: Error 111 "
        "connecting to 127.0.0.1:1. Connection refused.); the task failed"]


def test_a_tick_running_as_the_broker_dies_fails_in_one_line_and_its_result_lands_after(tmp_path) -> None:
    with restartable_redis() as server:
        env = {"POWERFLEET_BROKER__URL": server.url, "POWERFLEET_NODES": "[]"}
        app = create_app(load_config(environ=env))
        r = redis.Redis.from_url(server.url, socket_timeout=120)
        # A long agent-presence SCAN (a million keys, none an agent's) holds the tick inside its body.
        # Written in scripts of 100,000 keys: one script of a million outlasted a socket timeout at load 11.
        for first in range(0, FILLER_KEYS, 100_000):
            r.eval("for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do redis.call('SET', 'filler:' .. i, '') end",
                   0, first, first + 99_999)
        assert r.dbsize() == FILLER_KEYS
        with Launcher(log_dir=tmp_path, env=env) as launcher:
            worker = launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@midtask")
            wait_worker(app, "ctl@midtask")
            tick = app.send_task("powerfleet.fleet.reconcile", kwargs={})
            wait_for(lambda: f"[{tick.id}] received" in worker.log.read_text(), "the worker to take the tick",
                     every_s=0.01)
            server.kill()
            wait_for(lambda: "not stored yet" in worker.log.read_text(), "the tick's result store to wait")
            log = worker.log.read_text()
            assert "powerfleet.fleet.reconcile: the broker's Redis became unreachable mid-task" in log, \
                "the kill did not land inside the tick's body:\n" + log[-3000:]
            server.start()  # empty: the result lands here once the store's next try runs
            meta = wait_for(lambda: _stored(server, tick.id), "the tick's FAILURE to be stored after the outage")
            assert meta["status"] == "FAILURE" and meta["result"]["exc_type"] == "RedisUnreachable", meta
            wait_worker(app, "ctl@midtask", timeout_s=90)
            # Read from Redis, not through this process's result subscription, which the kill cut.
            echo = app.send_task("powerfleet.fleet.echo", kwargs={"payload": 7})
            meta = wait_for(lambda: _stored(server, echo.id), "a task sent after the outage to run", timeout_s=60)
            assert meta["status"] == "SUCCESS" and meta["result"]["payload"] == 7, meta
            assert worker.proc.poll() is None
            log = worker.log.read_text()
            assert "Traceback" not in log and "ERROR/" not in log and "CRITICAL" not in log, log[-4000:]
            assert "raised expected: RedisUnreachable" in log, log[-3000:]
            for sent in (tick, echo):  # unsubscribed while the server is up, not at garbage collection
                sent.forget()
