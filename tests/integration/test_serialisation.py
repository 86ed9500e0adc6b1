"""JSON only: a pickled message is refused, nothing runs, and the worker carries on.

Celery will not start a worker that accepts pickle as root (``SecurityError``) unless
``C_FORCE_ROOT`` is set, and CI runs as root: without it a worker wrongly accepting pickle
would fail this test by never starting, which says nothing about refusal. With it, the
worker starts whatever it accepts, so only ``accept_content`` decides what happens to the
pickled message below.
"""

import uuid

import redis
from kombu import Connection, Exchange

from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker


def test_pickled_message_is_refused_and_does_not_run(launcher: Launcher, app, broker_url) -> None:
    worker = launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@test",
                            env={"C_FORCE_ROOT": "1"})
    wait_worker(app, "ctl@test")

    task_id = str(uuid.uuid4())
    headers = {"lang": "py", "task": "powerfleet.fleet.echo", "id": task_id, "root_id": task_id,
               "parent_id": None, "group": None, "retries": 0, "eta": None, "expires": None,
               "argsrepr": "()", "kwargsrepr": "{}", "origin": "test"}
    body = ((), {"payload": "from pickle"}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    with Connection(broker_url) as conn:  # raw kombu: the fleet's own send path would refuse to send it
        conn.Producer().publish(body, exchange=Exchange("control"), routing_key="control",
                                serializer="pickle", headers=headers, declare=[])

    # A JSON task sent after it is served: the worker has passed the pickled message by then.
    after = app.send_task("powerfleet.fleet.echo", kwargs={"payload": "json"})
    assert after.get(timeout=30)["payload"] == "json"
    assert worker.proc.poll() is None  # still serving, not crashed by the refusal
    assert app.AsyncResult(task_id).state == "PENDING"  # no result: it never ran
    r = redis.Redis.from_url(broker_url)
    assert r.llen("control") == 0 and r.hlen("unacked") == 0  # dropped, not waiting to be redelivered
    log = worker.log.read_text()
    assert "Refusing to deserialize untrusted content of type pickle" in log
    assert f"[{task_id}] received" not in log  # the worker never accepted it as a task
