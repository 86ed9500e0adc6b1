"""`powerfleet status` at fleet scale: node agents are not inspected one by one.

Each announced agent ``agent@<node>`` consumes ``node.<node>`` only, so status lists it from its
announcement instead of waiting for one inspect reply per node (11.6 s at 10,000 agents in
bench/scale.py); the control and sweep workers are still asked what they consume.
"""

import json

import redis

from powerfleet.broker.steps import ANNOUNCE_TTL_S, WORKER_KEY
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import run_cli, wait_worker


def test_status_lists_announced_agents_without_asking_each_and_still_asks_the_other_workers(
        launcher: Launcher, app, broker_url, fleet_env) -> None:
    launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@status")
    launcher.spawn("agent-a", "agent", "--node", "a")
    wait_worker(app, "ctl@status")
    wait_worker(app, "agent@a")
    r = redis.Redis.from_url(broker_url)
    silent = [f"gpu-{i:04d}" for i in range(2000)]  # announced, and no process to answer an inspect
    with r.pipeline(transaction=False) as p:
        for node in silent:
            p.set(f"{WORKER_KEY}agent@{node}", "1", ex=ANNOUNCE_TTL_S)
        p.execute()

    out = run_cli("status", "--json", "--timeout", "5", env=fleet_env, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    workers = data["workers"]
    assert workers.get("ctl@status") == ["control"], workers.get("ctl@status")
    assert workers.get("agent@a") == ["node.a"], workers.get("agent@a")
    wrong = {n: workers.get(f"agent@{n}") for n in silent if workers.get(f"agent@{n}") != [f"node.{n}"]}
    assert not wrong, list(wrong.items())[:3]
    assert data["workers_not_answering"] == [], data["workers_not_answering"][:5]
    assert data["queues"]["node.gpu-1999"] == 0, {q: d for q, d in data["queues"].items() if d}
