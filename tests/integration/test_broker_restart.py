"""The broker stops and comes back while a worker runs: it reconnects, later tasks run, no traceback storm."""

import redis

from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.config import load_config
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for


def test_worker_survives_a_broker_restart(tmp_path) -> None:
    with EmbeddedRedis() as server:
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
            assert log.count("Traceback") <= 2, log[-4000:]
