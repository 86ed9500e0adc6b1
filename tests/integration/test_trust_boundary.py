"""The task API's trust boundary against a running fleet (issue 29): real redis-server, a real control
worker, `powerfleet trigger` and Flower's HTTP API.

A person may send only manual tasks with their manual fields; every argument is taken only as its own
type, by the sender and again by the worker that decodes the message.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, event, given, settings

from powerfleet.broker.embedded import free_loopback_port
from powerfleet.budget.state import PROPOSALS
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import run_cli, wait_worker
from tests.integration.task_messages import messages, must_refuse, wrongly_typed
from tests.waiting import wait_for

DEPLOYMENTS = '{"ns/llm": {"power_limit_w": 10000}}'
FORGED_OVERLAY = {"node": "a", "group": "rack-a", "caps": {"GPU-1": 1.0}, "safe": {"GPU-1": 1.0},
                  "period_s": 3600, "revision": 10**18, "issued_at": 0.0}
EXAMPLES = int(os.environ.get("POWERFLEET_TRUST_EXAMPLES", "12"))  # trigger examples; Flower gets 5x as many


@pytest.fixture
def budget_env(fleet_env: dict[str, str], launcher: Launcher) -> dict[str, str]:
    fleet_env["POWERFLEET_BUDGET__DEPLOYMENTS"] = DEPLOYMENTS
    launcher.env["POWERFLEET_BUDGET__DEPLOYMENTS"] = DEPLOYMENTS
    return fleet_env


def _sent_state(r: redis.Redis) -> set[bytes]:
    """What a send leaves in Redis: queues and result keys (a worker's bookkeeping keys aside)."""
    # (Flower's and the CLI's own worker inspections leave `<uuid>.reply.celery.pidbox` replies: no task.)
    return {k for k in r.keys() if not k.startswith((b"unacked", b"_kombu")) and not k.endswith(b".reply.celery.pidbox")}


@pytest.mark.parametrize(("task", "kwargs", "says"), [
    ("powerfleet.agent.throttle", FORGED_OVERLAY, "powerfleet.agent.throttle: an internal task"),
    # The forged group limit of issue 29: no such field exists any more (the allowance is read from Redis).
    ("powerfleet.budget.evaluate", {"deployment": "ns/llm", "group": "rack-a", "group_limit_w": 16800,
                                    "group_gpu_capacity": 36, "from_tick": True},
     "powerfleet.budget.evaluate: group: unknown argument"),
    ("powerfleet.budget.evaluate", {"deployment": "ns/llm", "generation": 10**15},
     "powerfleet.budget.evaluate: generation: set only by the fleet itself"),
    ("powerfleet.retune.harvest", {"sid": "nosuch"}, "powerfleet.retune.harvest: an internal task"),
    ("powerfleet.budget.propose", {"deployment": "ns/llm", "replicas": {"worker": True}},
     "replicas.worker: Input should be a valid integer"),
    ("powerfleet.retune.window", {"dgd": "llm-agg", "window": "5"}, "window: Input should be a valid integer"),
])
def test_trigger_refuses_internal_tasks_fields_and_other_types(fleet_env, broker_url, task, kwargs, says) -> None:
    r = redis.Redis.from_url(broker_url)
    before = set(r.keys())
    out = run_cli("trigger", task, "--args", json.dumps(kwargs), env=fleet_env)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert set(r.keys()) == before, set(r.keys()) - before


@pytest.fixture
def control_worker(launcher: Launcher, app, budget_env):
    child = launcher.spawn("worker", "worker", "--queues", "control,sweep", "--name", "ctl@trust")
    wait_worker(app, "ctl@trust")
    return child


def test_a_message_published_past_the_task_api_is_decoded_strictly_by_the_worker(control_worker, app) -> None:
    """What the broker's credentials may publish is still taken only as its own types."""
    r = redis.Redis.from_url(app.conf.broker_url)
    raw = Celery.send_task  # the plain Celery publish: no check in the sender
    for task, kwargs, says in [
        ("powerfleet.budget.propose", {"deployment": "ns/llm", "replicas": {"worker": True}}, "replicas.worker"),
        ("powerfleet.budget.propose", {"deployment": "ns/llm", "replicas": {"decode": "16"}}, "replicas.decode"),
    ]:
        result = raw(app, task, kwargs=kwargs)
        result.get(timeout=60, propagate=False)
        assert result.state == "FAILURE", (task, kwargs, result.state, result.result)
        assert says in str(result.result) and "valid integer" in str(result.result), (kwargs, result.result)
    assert r.hget(PROPOSALS, "ns/llm") is None, r.hget(PROPOSALS, "ns/llm")
    # The same task with its own types is stored as sent.
    ok = raw(app, "powerfleet.budget.propose", kwargs={"deployment": "ns/llm", "replicas": {"worker": 4}})
    assert ok.get(timeout=60)["replicas"] == {"worker": 4}


def _check_accepted(app, r, name, kwargs, task_id) -> None:
    event(f"accepted {name}")
    wrong = wrongly_typed(app, name, kwargs)
    assert must_refuse(app, name, kwargs) is None and wrong is None, (name, kwargs, wrong)
    result = app.AsyncResult(task_id)
    result.get(timeout=90, propagate=False)  # any end: some need a cluster this fleet has not
    assert result.state in ("SUCCESS", "FAILURE"), (name, kwargs, result.state, result.result)
    stored = r.hget(PROPOSALS, "ns/llm")
    if stored is not None:  # what a proposal may hold: counts a person could send, ints only
        for role, n in json.loads(stored)["replicas"].items():
            assert type(n) is int and 0 <= n <= 100_000, (name, kwargs, stored)


def _check_refused(app, name, kwargs, line: str) -> None:
    event("refused as internal" if must_refuse(app, name, kwargs) else "refused")
    assert line and "\n" not in line.strip() and "Traceback" not in line, (name, kwargs, line)
    expected = must_refuse(app, name, kwargs)
    assert expected is None or expected in line, (name, kwargs, line)


def test_hostile_messages_through_trigger_and_flower(control_worker, launcher: Launcher, app, budget_env) -> None:
    r = redis.Redis.from_url(app.conf.broker_url)
    port = free_loopback_port()
    launcher.env.update({"POWERFLEET_FLOWER__PORT": str(port), "POWERFLEET_FLOWER__BASIC_AUTH": "[ops:pw-9]"})
    launcher.spawn("flower", "flower")
    auth = ("ops", "pw-9")
    suppress = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=suppress)
    @given(messages(app))
    def through_trigger(message) -> None:
        name, kwargs = message
        before = _sent_state(r)
        out = run_cli("trigger", name, "--args", json.dumps(kwargs), "--no-wait", env=budget_env)
        if out.returncode == 0:
            _check_accepted(app, r, name, kwargs, json.loads(out.stdout)["task_id"])
            return
        assert out.returncode in (1, 2), (name, kwargs, out.returncode, out.stderr)
        _check_refused(app, name, kwargs, out.stderr)
        # Nothing queued and no result key: no key appeared (a worker's heartbeat may expire meanwhile).
        assert _sent_state(r) <= before, (name, kwargs, _sent_state(r) - before)

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        wait_for(lambda: client.get("/healthcheck").status_code == 200, "flower to serve /healthcheck", 60)

        @settings(max_examples=5 * EXAMPLES, deadline=None, derandomize=True, suppress_health_check=suppress)
        @given(messages(app))
        def through_flower(message) -> None:
            name, kwargs = message
            before = _sent_state(r)
            for endpoint in ("send-task", "async-apply"):
                answer = client.post(f"/api/task/{endpoint}/{name}", auth=auth, json={"kwargs": kwargs})
                if answer.status_code == 200:
                    _check_accepted(app, r, name, kwargs, answer.json()["task-id"])
                    return
                assert answer.status_code == 400, (name, kwargs, answer.status_code, answer.text[:300])
                _check_refused(app, name, kwargs, answer.text)
                # Nothing queued and no result key: no key appeared (a worker's heartbeat may expire meanwhile).
                assert _sent_state(r) <= before, (name, kwargs, _sent_state(r) - before)

        through_flower()
        # The task list shows each result beside its state, its summary first (a skipped pass reads
        # "skipped: ..." there; a tick "fleet-tick ...").
        page = client.get("/tasks", auth=auth)
        assert page.status_code == 200 and '<th data-column="result">Result</th>' in page.text, page.text[:500]

        def listed_row() -> dict | None:
            # Flower switches task events on every few seconds: a tick sent before that is not listed.
            client.post("/api/task/send-task/powerfleet.retune.tick", auth=auth, json={})
            rows = client.get("/tasks/datatable", auth=auth, params={
                "draw": 1, "start": 0, "length": 100, "order[0][column]": 0, "order[0][dir]": "desc",
                "columns[0][data]": "received"}).json()["data"]
            return next((x for x in rows if x.get("name") == "powerfleet.retune.tick" and x.get("result")), None)

        row = wait_for(listed_row, "Flower's task list to show the tick's result", timeout_s=90, every_s=1.0)
        assert row["state"] == "SUCCESS" and str(row["result"]).startswith("{'summary': 'fleet-tick retune'"), row
    through_trigger()
