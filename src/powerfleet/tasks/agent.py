"""Node agent tasks, routed to ``node.<node>`` and run only by that node's agent worker.

Cap enforcement (cgroup -> pod mapping, NVML clamps, managed-set persistence) is the node
agent's own issue; this task is the routed entry point it plugs into.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from powerfleet.tasks.base import TaskArgs, delivered_queue, fleet_task
from powerfleet.tasks.ports import clock


class NodeArgs(TaskArgs):
    node: str = Field(min_length=1, max_length=253)


class NodeReconcileResult(TaskArgs):
    node: str
    worker: str | None
    queue: str | None
    at: float
    applied: list[dict[str, Any]]


@fleet_task("powerfleet.agent.reconcile", NodeArgs, acks_late=True)
def reconcile_node(self: Any, params: NodeArgs) -> NodeReconcileResult:
    return NodeReconcileResult(node=params.node, worker=self.request.hostname, queue=delivered_queue(self.request),
                               at=clock.now(), applied=[])
