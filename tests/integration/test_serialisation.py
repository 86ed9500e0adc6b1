"""JSON only: a pickled message is refused and nothing runs."""

import uuid

from kombu import Connection, Exchange

from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker


def test_pickled_message_is_refused_and_does_not_run(launcher: Launcher, app, broker_url) -> None:
    worker = launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@test")
    wait_worker(app, "ctl@test")

    task_id = str(uuid.uuid4())
    headers = {"lang": "py", "task": "powerfleet.fleet.echo", "id": task_id, "root_id": task_id,
               "parent_id": None, "group": None, "retries": 0, "eta": None, "expires": None,
               "argsrepr": "()", "kwargsrepr": "{}", "origin": "test"}
    body = ((), {"payload": "from pickle"}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    with Connection(broker_url) as conn:
        conn.Producer().publish(body, exchange=Exchange("control"), routing_key="control",
                                serializer="pickle", headers=headers, declare=[])

    # A JSON task sent after it is served: the worker has passed the pickled message by then.
    after = app.send_task("powerfleet.fleet.echo", kwargs={"payload": "json"})
    assert after.get(timeout=30)["payload"] == "json"
    assert app.AsyncResult(task_id).state == "PENDING"
    log = worker.log.read_text()
    assert "Refusing to deserialize untrusted content of type pickle" in log
    assert f"[{task_id}] received" not in log  # the worker never accepted it as a task
