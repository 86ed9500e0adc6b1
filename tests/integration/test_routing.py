"""A task routed to node.a runs on the agent consuming node.a, never on node.b's."""

from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker


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
