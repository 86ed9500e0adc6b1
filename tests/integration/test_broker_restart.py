"""The broker stops and comes back while a worker runs: it reconnects, later tasks run, no traceback storm."""

import redis

from powerfleet.config import load_config
from powerfleet.testing.redisproc import restartable_redis
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for


def test_worker_survives_a_broker_restart(tmp_path) -> None:
    with restartable_redis() as server:
        env = {"POWERFLEET_BROKER__URL": server.url}
        app = create_app(load_config(environ=env))
        with Launcher(log_dir=tmp_path, env=env) as launcher:
            worker = launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@restart")
            wait_worker(app, "ctl@restart")
            assert app.send_task("powerfleet.fleet.echo", kwargs={"payload": 1}).get(timeout=30)["payload"] == 1

            server.stop()
            wait_for(lambda: "Cannot connect to redis" in worker.log.read_text()
                     or "Connection to broker lost" in worker.log.read_text(),
                     "the worker to notice the broker is gone")
            server.start()  # same port, empty data: queues and bindings must be re-declared
            wait_for(lambda: redis.Redis.from_url(server.url).ping(), "the broker to answer again")
            wait_worker(app, "ctl@restart", timeout_s=90)

            results = [app.send_task("powerfleet.fleet.echo", kwargs={"payload": n}) for n in range(3)]
            assert [r.get(timeout=60)["payload"] for r in results] == [0, 1, 2]
            assert worker.proc.poll() is None
            log = worker.log.read_text()
            assert "Traceback" not in log, log[-4000:]


def test_beat_and_worker_wait_out_a_broker_outage_in_one_line_per_retry(tmp_path) -> None:
    from powerfleet.beat.ticklog import TickLog

    with restartable_redis() as server:
        env = {"POWERFLEET_BROKER__URL": server.url, "POWERFLEET_NODES": "[]",
               "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "1",
               "POWERFLEET_BEAT__LOCK_TIMEOUT_S": "5"}
        app = create_app(load_config(environ=env))
        with Launcher(log_dir=tmp_path, env=env) as launcher:
            worker = launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@outage")
            beat = launcher.spawn("beat", "beat")
            wait_worker(app, "ctl@outage")
            wait_for(lambda: TickLog(redis.Redis.from_url(server.url)).origins("reconcile"), "a first tick")

            server.stop()
            wait_for(lambda: beat.log.read_text().count("beat: broker unreachable") >= 2, "beat to retry twice")
            wait_for(lambda: worker.log.read_text().count("consumer: Cannot connect to") >= 2,
                     "the worker to retry twice")
            server.start()  # empty: the lock is gone, beat must re-take it before ticking
            wait_for(lambda: TickLog(redis.Redis.from_url(server.url)).origins("reconcile"),
                     "beat to tick again after the outage", timeout_s=60)
            assert beat.proc.poll() is None and worker.proc.poll() is None
            for child in (beat, worker):
                log = child.log.read_text()
                assert "Traceback" not in log, log[-4000:]
                assert "CRITICAL" not in log and "ERROR/" not in log, log[-4000:]
            retries = [ln for ln in worker.log.read_text().splitlines() if "Cannot connect to" in ln]
            assert all("WARNING/" in ln and "Trying again" in ln for ln in retries), retries
