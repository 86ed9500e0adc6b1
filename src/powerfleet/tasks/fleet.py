"""Fleet-wide tasks: the reconcile tick that fans out to node agents, and diagnostics."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from powerfleet.beat.ticklog import TickLog
from powerfleet.tasks.base import NoArgs, TaskArgs, delivered_queue, fleet_task
from powerfleet.tasks.ports import clock, fleet_redis


class EchoArgs(TaskArgs):
    payload: Any = None


@fleet_task("powerfleet.fleet.echo", EchoArgs, acks_late=False)
def echo(self: Any, params: EchoArgs) -> dict[str, Any]:
    """Return the payload and where it ran: the task API's smoke test."""
    return {"payload": params.payload, "worker": self.request.hostname,
            "queue": delivered_queue(self.request)}


@fleet_task("powerfleet.fleet.noop", NoArgs, acks_late=False, ignore_result=False)
def noop(self: Any, params: NoArgs) -> None:
    """Does nothing; bench/dispatch.py measures the fleet's overhead with it."""
    return None


class ReconcileResult(TaskArgs):
    at: float
    dispatched: list[str] = Field(description="nodes sent an agent.reconcile")


@fleet_task("powerfleet.fleet.reconcile", NoArgs, acks_late=False)
def reconcile_tick(self: Any, params: NoArgs) -> ReconcileResult:
    """Reconcile tick: one agent.reconcile per GPU node, each on its own node queue."""
    now = clock.now()
    expires = self.app.fleet_config.beat.reconcile_interval_s
    nodes = list(self.app.fleet_config.nodes)
    for node in nodes:
        # expires: a cap order queued for a node that is down must not run hours later.
        self.app.send_task("powerfleet.agent.reconcile", kwargs={"node": node}, expires=expires)
    detail = f"agent.reconcile -> {', '.join(f'node.{n}' for n in nodes)}" if nodes else "no GPU nodes configured"
    TickLog(fleet_redis(self.app)).record("reconcile", now, self.request.origin, detail)
    return ReconcileResult(at=now, dispatched=nodes)
