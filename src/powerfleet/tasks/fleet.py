"""Fleet-wide tasks: the reconcile tick that fans out to node agents, and diagnostics."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from powerfleet.agent.presence import live_agents
from powerfleet.beat.ticklog import TickLog
from powerfleet.config.fleet import is_node_name
from powerfleet.tasks.base import NoArgs, TaskArgs, delivered_queue, fleet_task
from powerfleet.tasks.ports import clock, fleet_redis


class EchoArgs(TaskArgs):
    payload: Any = None


@fleet_task("powerfleet.fleet.echo", EchoArgs, acks_late=False, manual=True)
def echo(self: Any, params: EchoArgs) -> dict[str, Any]:
    """Return the payload and where it ran: the task API's smoke test."""
    return {"payload": params.payload, "worker": self.request.hostname,
            "queue": delivered_queue(self.request)}


@fleet_task("powerfleet.fleet.noop", NoArgs, acks_late=False, manual=True, ignore_result=False)
def noop(self: Any, params: NoArgs) -> None:
    """Does nothing; bench/dispatch.py measures the fleet's overhead with it."""
    return None


# Names a reconcile result keeps. The result stays in Redis for broker.result_expires_s (a day by
# default: 5,760 ticks), so a full list of 10,000 nodes would hold ~600 MB there (bench/scale.py).
RESULT_NODES = 100


class ReconcileResult(TaskArgs):
    at: float
    dispatched: list[str] = Field(description=f"nodes sent an agent.reconcile: the first {RESULT_NODES}, sorted")
    count: int = Field(description="how many nodes were sent one (len(dispatched) up to RESULT_NODES)")


AGENT_RECONCILE = "powerfleet.agent.reconcile"


def tick_nodes(configured: list[str], live: set[str]) -> list[str]:
    """Nodes that get a pass: the configured ones and every agent with a live heartbeat."""
    # A heartbeat key anyone could write must never become a queue name unchecked.
    return sorted({n for n in live if is_node_name(n)} | set(configured))


def fan_out(app: Any, nodes: list[str], expires: float) -> None:
    """Send one agent.reconcile per node, cheaply.

    One producer (one connection) for all of them, kombu's publish batch (the LPUSHes go out
    pipelined, not one round trip each), queue declarations cached on that connection, and no
    result subscription per message (the agent's metrics and readiness report its passes).
    ``expires``: a pass queued for a node that is down must not run hours later.
    ``add_to_parent=False``: sent from the tick task, each message would otherwise be recorded as a
    child in the tick's stored result (65 bytes a node, kept for broker.result_expires_s: 3.7 GB of
    Redis a day at 10,000 nodes; bench/scale.py).
    ``declare=[]``: Celery publishes a node queue's message straight to its Redis list (the
    default exchange), so declaring the queue adds nothing but, once per connection and queue, two
    round trips and kombu's binding key: a first tick at 10,000 nodes took 13.6 CPU s with, 3.5
    without. The agent declares its own queue when it starts consuming.
    """
    with app.producer_or_acquire() as producer, producer.batch(max_size=1000):
        for node in nodes:
            # argsrepr/kwargsrepr given: Celery would build the same strings with its pure-Python
            # saferepr (16 % of the fan-out under cProfile; within noise unprofiled, docs/benchmarks.md)
            app.send_task(AGENT_RECONCILE, kwargs={"node": node}, expires=expires, producer=producer,
                          ignore_result=True, add_to_parent=False, declare=[],
                          argsrepr="()", kwargsrepr=repr({"node": node}))


@fleet_task("powerfleet.fleet.reconcile", NoArgs, acks_late=False, manual=True)
def reconcile_tick(self: Any, params: NoArgs) -> ReconcileResult:
    """Reconcile tick: one agent.reconcile per GPU node (configured or live), each on its node queue."""
    now = clock.now()
    r = fleet_redis(self.app)
    nodes = tick_nodes(list(self.app.fleet_config.nodes), live_agents(r))
    fan_out(self.app, nodes, expires=self.app.fleet_config.beat.reconcile_interval_s)
    shown = ", ".join(f"node.{n}" for n in nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
    detail = f"agent.reconcile -> {shown}" if nodes else "no GPU nodes (none configured, no live agent)"
    TickLog(r).record("reconcile", now, self.request.origin, detail)
    return ReconcileResult(at=now, dispatched=nodes[:RESULT_NODES], count=len(nodes))
