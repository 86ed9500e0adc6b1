"""The task API: `powerfleet trigger` and Flower's HTTP API each run a task and return its JSON result."""

import json
import subprocess
import sys

import httpx
import pytest
import redis

from powerfleet.broker.embedded import free_loopback_port
from powerfleet.workers.launcher import Launcher
from tests.envs import subprocess_env
from tests.integration.conftest import run_cli, wait_worker
from tests.waiting import wait_for


@pytest.fixture
def control_worker(launcher: Launcher, app):
    child = launcher.spawn("worker", "worker", "--queues", "control,sweep", "--name", "ctl@test")
    wait_worker(app, "ctl@test")
    return child


def test_trigger_runs_a_task_and_prints_its_json_result(control_worker, fleet_env) -> None:
    out = run_cli("trigger", "powerfleet.fleet.echo", "--args", '{"payload": {"x": [1, 2]}}', env=fleet_env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["payload"] == {"x": [1, 2]}
    assert result["worker"] == "ctl@test"
    assert result["queue"] == "control"


def test_trigger_no_wait_prints_the_task_id(control_worker, fleet_env, app) -> None:
    out = run_cli("trigger", "powerfleet.fleet.echo", "--args", '{"payload": 7}', "--no-wait", env=fleet_env)
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout)
    assert app.AsyncResult(sent["task_id"]).get(timeout=30)["payload"] == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["powerfleet.fleet.nope"], "unknown task 'powerfleet.fleet.nope'"),
        (["celery.ping"], "unknown task 'celery.ping'"),
        (["powerfleet.fleet.echo", "--args", "{not json"], "--args: not valid JSON"),
        (["powerfleet.fleet.echo", "--args", "3"], "--args: must be a JSON object"),
        (["powerfleet.fleet.echo", "--args", "[1]"], "--args: must be a JSON object"),
        (["powerfleet.fleet.echo", "--args", '{"payload": NaN}'], "NaN is not allowed"),
        (["powerfleet.fleet.echo", "--args", '{"payload": [-Infinity]}'], "-Infinity is not allowed"),
        (["powerfleet.agent.reconcile", "--args", "{}"], "powerfleet.agent.reconcile: node: Field required"),
        (["powerfleet.agent.reconcile", "--args", '{"node": 7}'], "node: Input should be a valid string"),
        (["powerfleet.agent.reconcile", "--args", '{"node": "bad node/../x"}'],
         "node 'bad node/../x' is not a valid Kubernetes node name"),
        (["powerfleet.fleet.echo", "--args", '{"bogus": 1}'], "powerfleet.fleet.echo: bogus: unknown argument"),
        (["powerfleet.retune.window", "--args", '{"dgd": "d", "window": "soon"}'], "window: Input should be"),
        (["powerfleet.retune.window", "--args", '{"dgd": "d", "window": -3}'], "window: Input should be greater than"),
        (["powerfleet.fleet.echo", "--queue", "node.bad node"], "--queue: 'node.bad node' is not a fleet queue"),
        (["powerfleet.fleet.echo", "--args", "@/nonexistent/args.json"], "--args: cannot read /nonexistent/args.json"),
        (["powerfleet.fleet.echo", "--args", '{"payload": 1, "payload": 2}'], "--args: key 'payload' appears twice"),
        (["powerfleet.fleet.echo", "--args", '{"payload": 1e400}'], "NaN or an infinity"),
        (["powerfleet.fleet.echo", "--queue", "node.a"], "is a node queue; only powerfleet.agent.* tasks run there"),
        (["powerfleet.budget.propose", "--args", '{"deployment": "a/b", "replicas": {"decode": -1}}'],
         "replicas.decode: Input should be greater than or equal to 0"),
    ],
)
def test_trigger_refuses_bad_input_before_sending(fleet_env, broker_url, args, message) -> None:
    r = redis.Redis.from_url(broker_url)
    before = set(r.keys())
    out = run_cli("trigger", *args, env=fleet_env)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    # Nothing was sent: no queue, no result key, no illegal queue name left behind.
    assert set(r.keys()) == before


def test_trigger_reads_args_from_a_file_or_stdin(control_worker, fleet_env, tmp_path) -> None:
    big = {"payload": {"rows": list(range(5000))}}
    (tmp_path / "args.json").write_text(json.dumps(big))
    out = run_cli("trigger", "powerfleet.fleet.echo", "--args", f"@{tmp_path / 'args.json'}", env=fleet_env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["payload"] == big["payload"]
    piped = subprocess.run([sys.executable, "-m", "powerfleet.cli", "trigger", "powerfleet.fleet.echo", "--args", "-"],
                           input='{"payload": "from stdin"}', capture_output=True, text=True, timeout=60,
                           env={**subprocess_env(), **fleet_env})
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["payload"] == "from stdin"


def test_trigger_refuses_a_payload_over_the_limit(fleet_env, broker_url, tmp_path) -> None:
    r = redis.Redis.from_url(broker_url)
    (tmp_path / "big.json").write_text(json.dumps({"payload": "x" * (1024 * 1024)}))
    out = run_cli("trigger", "powerfleet.fleet.echo", "--args", f"@{tmp_path / 'big.json'}", env=fleet_env)
    assert out.returncode == 2 and "over the task API's limit of 1048576 bytes" in out.stderr, out.stderr
    assert r.llen("control") == 0


def test_trigger_timeout_is_one_line(fleet_env) -> None:
    # No worker consumes control: the wait runs out.
    out = run_cli("trigger", "powerfleet.fleet.echo", "--timeout", "0.5", env=fleet_env)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "no result within 0.5s; is a worker consuming control?" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_trigger_help_says_what_args_accepts() -> None:
    out = run_cli("trigger", "--help", env={"COLUMNS": "200"})
    assert out.returncode == 0
    for phrase in ("JSON object", "@FILE", "stdin", "NaN"):
        assert phrase in out.stdout


def test_unreachable_broker_gives_one_line(fleet_env) -> None:
    env = dict(fleet_env, POWERFLEET_BROKER__URL=f"redis://:s3cret@127.0.0.1:{free_loopback_port()}/0")
    for cmd in (["trigger", "powerfleet.fleet.echo"], ["status"]):
        out = run_cli(*cmd, env=env)
        assert out.returncode == 1
        assert "broker unreachable at redis://:***@127.0.0.1" in out.stderr
        assert "s3cret" not in out.stderr  # no secrets in logs
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_flower_http_api_runs_a_task(control_worker, launcher: Launcher, app) -> None:
    port = free_loopback_port()
    launcher.env.update({"POWERFLEET_FLOWER__PORT": str(port), "POWERFLEET_FLOWER__BASIC_AUTH": "[ops:pw-123]"})
    flower = launcher.spawn("flower", "flower")
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10) as client:
        wait_for(lambda: client.get("/healthcheck").status_code == 200, "flower to serve /healthcheck")
        assert client.post("/api/task/send-task/powerfleet.fleet.echo", json={}).status_code == 401
        auth = ("ops", "pw-123")
        sent = client.post("/api/task/send-task/powerfleet.fleet.echo", auth=auth,
                           json={"kwargs": {"payload": "via flower"}})
        assert sent.status_code == 200, sent.text
        task_id = sent.json()["task-id"]
        done = wait_for(lambda: (r := client.get(f"/api/task/result/{task_id}", auth=auth).json())
                        and r["state"] == "SUCCESS" and r, "the task sent through Flower to succeed")
        assert done["result"]["payload"] == "via flower"
        # A bad send is refused with a message Flower shows, and nothing is published.
        nameless = client.post("/api/task/send-task/powerfleet.agent.reconcile", auth=auth, json={})
        assert nameless.status_code == 400
        assert "node: Field required" in nameless.text
        misspelt = client.post("/api/task/send-task/powerfleet.fleet.ecoh", auth=auth, json={})
        assert misspelt.status_code == 400
        assert "unknown task 'powerfleet.fleet.ecoh'" in misspelt.text
        illegal = client.post("/api/task/send-task/powerfleet.agent.reconcile", auth=auth,
                              json={"kwargs": {"node": "a/../b"}})
        assert illegal.status_code == 400 and "not a valid Kubernetes node name" in illegal.text
        # Flower asks the workers for task events every few seconds: wait until it sees tasks at all.
        wait_for(lambda: client.post("/api/task/send-task/powerfleet.fleet.noop", auth=auth, json={}) and
                 client.get("/api/tasks", auth=auth).json(), "Flower to receive task events", timeout_s=60)
        # Every scheduled task can be triggered by hand through the same API.
        for name in ("powerfleet.fleet.reconcile", "powerfleet.budget.tick", "powerfleet.retune.tick"):
            tid = client.post(f"/api/task/send-task/{name}", auth=auth, json={}).json()["task-id"]
            ran = wait_for(lambda: (r := client.get(f"/api/task/result/{tid}", auth=auth).json())
                           and r["state"] == "SUCCESS" and r, f"{name} sent through Flower to succeed")
            assert ran["result"]["at"] > 0
            # The tick families lead with a summary Flower's search finds apart from the node tasks.
            assert next(iter(ran["result"])) == "summary" and ran["result"]["summary"].startswith("fleet-tick ")

        def ticks_found() -> set[str]:
            found = client.get("/api/tasks", auth=auth, params={"search": "result:fleet-tick"}).json()
            return {t["name"] for t in found.values()}

        assert wait_for(lambda: len(ticks_found()) == 3 and ticks_found(), "Flower to find the ticks") == {
            "powerfleet.fleet.reconcile", "powerfleet.budget.tick", "powerfleet.retune.tick"}
        _flower_refuses_what_trigger_refuses(client, auth, app)
        _flower_shows_who_consumes_each_queue(client, auth, app, launcher)
        _flower_refuses_worker_control(client, auth, app)
    assert "pw-123" not in flower.log.read_text()


HOSTILE_SENDS = [
    # (endpoint, task, body, what the one-line answer says)
    ("send-task", "powerfleet.fleet.echo", {"queue": "node.../../x"}, "is not a fleet queue"),
    ("send-task", "powerfleet.fleet.echo", {"queue": "bogus"}, "'bogus' is not a fleet queue"),
    ("async-apply", "powerfleet.fleet.echo", {"queue": "bogus"}, "'bogus' is not a fleet queue"),
    ("send-task", "powerfleet.fleet.echo", {"queue": "node.a"}, "is a node queue"),
    ("send-task", "powerfleet.agent.reconcile", {"kwargs": {"node": "gpu-ghost"}}, "no live agent serves node 'gpu-ghost'"),
    ("send-task", "powerfleet.agent.reconcile", {"kwargs": {"node": "a"}, "queue": "node.b"}, "not this order's node queue"),
    ("send-task", "powerfleet.fleet.echo", {"countdown": "abc"}, "countdown: must be a number of seconds"),
    ("async-apply", "powerfleet.fleet.echo", {"countdown": "abc"}, "countdown: must be a number of seconds"),
    ("send-task", "powerfleet.fleet.echo", {"countdown": 1e12}, "countdown: must be 0 to 86400 seconds"),
    ("send-task", "powerfleet.fleet.echo", {"eta": "not-a-date"}, "eta: 'not-a-date' is not a date"),
    ("send-task", "powerfleet.fleet.echo", {"expires": -5}, "expires: must be more than 0"),
    ("send-task", "powerfleet.fleet.echo", {"serializer": "pickle"}, "only 'json' is accepted"),
    ("send-task", "powerfleet.fleet.echo", {"routing_key": "nowhere"}, "option 'routing_key' is not accepted"),
    ("send-task", "powerfleet.fleet.echo", {"kwargs": {"payload": "x" * (1024 * 1024 + 1)}}, "over the task API's limit"),
    ("send-task", "powerfleet.budget.propose", {"kwargs": {"deployment": "a/b", "replicas": {"decode": -1}}},
     "replicas.decode: Input should be greater than or equal to 0"),
]


def _flower_refuses_what_trigger_refuses(client, auth, app) -> None:
    r = redis.Redis.from_url(app.conf.broker_url)
    before = set(r.keys())
    for endpoint, task, body, message in HOSTILE_SENDS:
        answer = client.post(f"/api/task/{endpoint}/{task}", auth=auth, json=body)
        assert answer.status_code == 400, (endpoint, task, body, answer.status_code, answer.text[:300])
        assert message in answer.text and "\n" not in answer.text.strip(), (body, answer.text[:300])
    nan = client.post("/api/task/send-task/powerfleet.fleet.echo", auth=auth, content=b'{"countdown": NaN}')
    assert nan.status_code == 400 and "countdown" in nan.text, nan.text
    # Nothing was published: no list for a queue nobody reads, no result key.
    assert set(r.keys()) == before, set(r.keys()) - before
    # A good delay in either form is taken and runs.
    at = "2000-01-01 00:00:00.000000"  # in the past: runs now, as Celery does
    for body in ({"countdown": 0.2, "kwargs": {"payload": 1}}, {"eta": at, "expires": 600, "kwargs": {"payload": 2}}):
        sent = client.post("/api/task/send-task/powerfleet.fleet.echo", auth=auth, json=body)
        assert sent.status_code == 200, sent.text
        assert app.AsyncResult(sent.json()["task-id"]).get(timeout=30)["payload"] == body["kwargs"]["payload"]


def _flower_shows_who_consumes_each_queue(client, auth, app, launcher: Launcher) -> None:
    """The Broker page's Consumers column (and /api/queues/length) names each queue's workers.

    Flower's Redis adapter never filled it, and Flower inspected workers only at its start: the
    worker started here after Flower is found without anyone asking Flower to refresh.
    """
    launcher.spawn("late", "worker", "--queues", "sweep", "--name", "late@test")
    wait_worker(app, "late@test")
    r = redis.Redis.from_url(app.conf.broker_url)
    r.rpush("node.gpu-gone", "{}")  # a node queue whose agent is gone: listed, consumed by nobody
    try:
        def rows() -> dict[str, dict]:
            answer = client.get("/api/queues/length", auth=auth)
            assert answer.status_code == 200, answer.text
            got = {q["name"]: q for q in answer.json()["active_queues"]}
            return got if got.get("sweep", {}).get("consumers") == "ctl@test, late@test" else {}

        got = wait_for(rows, "Flower to name both consumers of sweep", timeout_s=60)
        assert got["control"]["consumers"] == "ctl@test"
        assert got["node.gpu-gone"]["consumers"] == "none" and got["node.gpu-gone"]["messages"] == 1
        page = client.get("/broker", auth=auth)
        assert page.status_code == 200
        assert "<td>ctl@test, late@test</td>" in page.text and "<td>node.gpu-gone</td>" in page.text
        # /api/workers lists each worker's queues, the late one included.
        workers = client.get("/api/workers", auth=auth).json()
        assert [q["name"] for q in workers["late@test"]["active_queues"]] == ["sweep"]
    finally:
        r.delete("node.gpu-gone")


def _flower_refuses_worker_control(client, auth, app) -> None:
    for path in ("/api/worker/shutdown/ctl@test", "/api/worker/pool/restart/ctl@test",
                 "/api/worker/pool/grow/ctl@test?n=2", "/api/worker/pool/shrink/ctl@test?n=1",
                 "/api/worker/pool/autoscale/ctl@test?min=1&max=4",
                 "/api/worker/queue/add-consumer/ctl@test?queue=node.a",
                 "/api/worker/queue/cancel-consumer/ctl@test?queue=control",
                 "/api/task/rate-limit/powerfleet.fleet.echo?workername=ctl@test&ratelimit=1/h",
                 "/api/task/timeout/powerfleet.fleet.echo?workername=ctl@test&hard=1",
                 "/api/task/revoke/some-task-id?terminate=true", "/api/task/abort/some-task-id"):
        answer = client.post(path, auth=auth)
        assert answer.status_code == 403 and "flower.allow_worker_control" in answer.text, (path, answer.text)
    # The worker is still there, consuming what it consumed.
    queues = app.control.inspect(destination=["ctl@test"], timeout=5).active_queues()
    assert sorted(q["name"] for q in queues["ctl@test"]) == ["control", "sweep"]


def test_flower_refuses_a_public_address_without_credentials(fleet_env) -> None:
    out = run_cli("flower", "--address", "0.0.0.0", env=fleet_env)
    assert out.returncode == 2
    assert "refusing to bind 0.0.0.0 without basic auth" in out.stderr


def test_status_reports_workers_queues_and_ticks(control_worker, fleet_env, app) -> None:
    app.send_task("powerfleet.fleet.reconcile").get(timeout=30)
    app.send_task("powerfleet.fleet.reconcile").get(timeout=30)
    # A node task for a node nobody serves: invisible to Flower and `inspect`, not to status.
    app.send_task("powerfleet.agent.reconcile", kwargs={"node": "gpu-node-zzz"})
    out = run_cli("status", "--json", env=fleet_env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert "control" in data["workers"]["ctl@test"]
    assert data["queues"]["node.gpu-node-zzz"] == 1
    # The two reconcile ticks' orders for a and b wait in queues no agent consumes.
    assert data["queues"]["node.a"] == 2 and data["queues"]["node.b"] == 2
    assert data["agents"] == []
    assert set(data["ticks"]) == {"reconcile", "budget", "retune"}
    assert data["ticks"]["reconcile"]["count"] == 2
    assert data["ticks"]["reconcile"]["age_s"] >= 0
    assert data["ticks"]["reconcile"]["detail"] == "agent.reconcile -> node.a, node.b"
    assert data["ticks"]["budget"] == {"count": 0, "last": None, "age_s": None, "detail": None}
    human = run_cli("status", env={**fleet_env, "COLUMNS": "200"})
    assert human.returncode == 0 and "agent.reconcile -> node.a, node.b" in human.stdout
    assert "node.gpu-node-zzz" in human.stdout and "NONE" in human.stdout


def test_node_task_for_a_node_without_a_live_agent_is_refused(fleet_env, broker_url) -> None:
    r = redis.Redis.from_url(broker_url)
    out = run_cli("trigger", "powerfleet.agent.reconcile", "--args", '{"node": "gpu-node-zzz"}', env=fleet_env)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "no live agent serves node 'gpu-node-zzz'" in out.stderr
    assert r.llen("node.gpu-node-zzz") == 0


def test_beat_metrics_show_every_queue_depth(launcher: Launcher, app) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    port = free_loopback_port()
    app.send_task("powerfleet.agent.reconcile", kwargs={"node": "gpu-node-zzz"})
    launcher.spawn("beat", "beat", "--metrics-port", str(port))

    def depth() -> float | None:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if smp.name == "powerfleet_queue_depth" and smp.labels == {"queue": "node.gpu-node-zzz"}:
                    return smp.value
        return None

    assert wait_for(depth, "beat to export the stranded node queue's depth") == 1


def test_a_bad_loglevel_is_one_line_even_with_a_live_broker(fleet_env) -> None:
    # With a broker there, the level reaches Celery's own CLI, whose click error was a traceback.
    for args in (["agent", "--node", "n1", "--loglevel", "BOGUS"], ["worker", "--loglevel", "BOGUS"]):
        out = run_cli(*args, env=fleet_env)
        assert out.returncode == 2, (args, out.stderr)
        # One line and nothing before it (the agent used to warn about cluster access first).
        assert out.stderr.strip().splitlines() == [
            "powerfleet: error: --loglevel: 'BOGUS' is not a log level (DEBUG, INFO, WARNING, ERROR, CRITICAL)"], out.stderr
