"""A task routed to node.a runs on the agent consuming node.a, never on node.b's; a tick's pass
for a node nobody serves expires within one interval."""

import json
from datetime import datetime, timedelta, timezone

import redis

from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for


def test_node_tasks_run_only_on_their_nodes_agent(launcher: Launcher, app) -> None:
    launcher.spawn("agent-a", "agent", "--node", "a")
    launcher.spawn("agent-b", "agent", "--node", "b")
    wait_worker(app, "agent@a")
    wait_worker(app, "agent@b")

    sent = [(node, app.send_task("powerfleet.agent.reconcile", kwargs={"node": node})) for node in "aabab" * 2]
    for node, result in sent:
        value = result.get(timeout=30)
        assert value["node"] == node
        assert value["worker"] == f"agent@{node}"
        assert value["queue"] == f"node.{node}"


def test_control_and_sweep_families_route_to_their_queues(app) -> None:
    route = app.amqp.router.route
    assert route({}, "powerfleet.budget.tick", (), {})["queue"].name == "control"
    assert route({}, "powerfleet.sweep.shard", (), {})["queue"].name == "sweep"
    assert route({}, "powerfleet.agent.reconcile", (), {"node": "gpu-7"})["queue"].name == "node.gpu-7"


def test_a_ticks_pass_for_a_node_without_an_agent_expires_within_one_interval(launcher: Launcher, app,
                                                                                 broker_url) -> None:
    """The value, not only its presence: a pass queued for a node nobody serves must be dropped
    once the next tick has replaced it, never run hours later when an agent comes back."""
    interval = 7.0  # neither the default (15) nor any other tick's interval
    launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@tick",
                   env={"POWERFLEET_BEAT__RECONCILE_INTERVAL_S": str(interval)})
    wait_worker(app, "ctl@tick")

    before = datetime.now(timezone.utc)
    assert app.send_task("powerfleet.fleet.reconcile", kwargs={}).get(timeout=30)["dispatched"] == ["a", "b"]
    after = datetime.now(timezone.utc)

    r = redis.Redis.from_url(broker_url)
    for node in ("a", "b"):  # configured, no agent: the passes wait in their queues
        queued = [json.loads(m) for m in r.lrange(f"node.{node}", 0, -1)]
        assert [m["headers"]["task"] for m in queued] == ["powerfleet.agent.reconcile"]
        # the reprs Flower shows are given by the fan-out, not built per message by Celery
        assert (queued[0]["headers"]["argsrepr"], queued[0]["headers"]["kwargsrepr"]) == ("()", repr({"node": node}))
        expires = datetime.fromisoformat(queued[0]["headers"]["expires"])
        assert before + timedelta(seconds=interval) <= expires <= after + timedelta(seconds=interval), \
            (before, expires, after)


def test_a_reconcile_tick_to_many_nodes_keeps_a_small_result_and_declares_no_queue(launcher: Launcher, app,
                                                                                   broker_url) -> None:
    """The tick's result lives in Redis for a day (5,760 ticks): its children and the full node
    list made it 98 kB at 1,502 nodes (bench/scale.py). It names the first RESULT_NODES and counts
    the rest; the passes go straight to the lists, undeclared (a first tick's declarations were
    13.6 CPU s at 10,000 nodes), and every node still gets its pass, a live agent's taken."""
    from powerfleet.agent.presence import beat
    from powerfleet.clock import FakeClock
    from powerfleet.tasks.fleet import RESULT_NODES

    r = redis.Redis.from_url(broker_url)
    live = [f"gpu-{i:04d}" for i in range(1500)]
    for node in live:  # live agents, as each one's heartbeat says (no agent consumes: the passes wait)
        beat(r, node, 15.0, FakeClock(t=1_800_000_000.0))
    launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@many")
    launcher.spawn("agent-a", "agent", "--node", "a")  # a real agent: its queue gets no declaration from the tick
    wait_worker(app, "ctl@many")
    wait_worker(app, "agent@a")

    sent = app.send_task("powerfleet.fleet.reconcile", kwargs={})
    result = sent.get(timeout=60)
    everyone = sorted(["a", "b", *live])
    assert result["count"] == len(everyone), result["count"]
    assert result["dispatched"] == everyone[:RESULT_NODES], result["dispatched"][:5]
    stored = r.memory_usage(f"celery-task-meta-{sent.id}")
    assert stored is not None and stored < 4096, f"the stored result holds {stored} bytes"
    waiting = [n for n in everyone if n != "a"]
    with r.pipeline(transaction=False) as p:
        for node in waiting:
            p.llen(f"node.{node}")
        depths = p.execute()
    assert depths == [1] * len(waiting), [n for n, d in zip(waiting, depths) if d != 1][:5]
    # Published straight to each list, undeclared: no kombu binding key per node (they never expire)
    bindings = sorted(k.decode() for k in r.scan_iter("_kombu.binding.node.gpu-*", count=1000))
    assert bindings == [], f"{len(bindings)} binding keys, e.g. {bindings[:3]}"
    wait_for(lambda: r.llen("node.a") == 0, "the agent of node a to take its pass")
