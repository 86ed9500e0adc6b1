"""Queues and the routing table: every task family goes to its queue.

- ``powerfleet.agent.*``      -> ``node.<node>`` (the ``node`` keyword argument)
- ``powerfleet.sweep.*``      -> ``sweep`` (sweep shards, probe, harvest)
- any other ``powerfleet.*``  -> ``control``

It sits at the bottom layer, beside config and clock, because every floor needs the queue
names (the app factory, the tasks, the agent's worker, metrics, the CLI) and none of them
may import a floor above: it depends on nothing but config's node-name rule.
"""

from __future__ import annotations

from typing import Any

from powerfleet.config.fleet import is_node_name

CONTROL_QUEUE = "control"
SWEEP_QUEUE = "sweep"
NODE_QUEUE_PREFIX = "node."

# Tick family -> the task beat sends for it. Here, not in the app factory, because the task base
# class (workers/outcomes.py), the CLI's status and the metrics all name the families, and the
# app factory imports the task base: the table at the bottom keeps that a line, not a circle.
TICK_FAMILIES: dict[str, str] = {
    "reconcile": "powerfleet.fleet.reconcile",
    "budget": "powerfleet.budget.tick",
    "retune": "powerfleet.retune.tick",
}


class RoutingError(ValueError):
    pass


def node_queue(node: str) -> str:
    return f"{NODE_QUEUE_PREFIX}{node}"


AGENT_WORKER_PREFIX = "agent@"  # a node's agent runs as the Celery worker agent@<node>, on node.<node> only


def agent_worker(node: str) -> str:
    return f"{AGENT_WORKER_PREFIX}{node}"


def agent_worker_node(worker: str) -> str | None:
    """The node whose agent the worker ``agent@<node>`` is (None: not an agent's name)."""
    node = worker[len(AGENT_WORKER_PREFIX):] if worker.startswith(AGENT_WORKER_PREFIX) else ""
    return node if is_node_name(node) else None


def family_of(task_name: str) -> str:
    """'node', 'sweep' or 'control': also selects the task's time limits."""
    if task_name.startswith("powerfleet.agent."):
        return "node"
    if task_name.startswith("powerfleet.sweep."):
        return "sweep"
    return "control"


def route_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> dict[str, str] | None:
    if not name.startswith("powerfleet."):
        return None
    family = family_of(name)
    if family == "node":
        node = kwargs.get("node") if isinstance(kwargs, dict) else None
        if not isinstance(node, str) or not node:
            raise RoutingError(f"{name} needs a 'node' keyword argument naming the GPU node")
        # The queue name is built from it: an illegal name must never become a Redis key.
        if not is_node_name(node):
            raise RoutingError(f"{name}: node {node!r} is not a valid Kubernetes node name")
        return {"queue": node_queue(node)}
    if family == "sweep":
        return {"queue": SWEEP_QUEUE}
    return {"queue": CONTROL_QUEUE}


def is_fleet_queue(queue: str) -> bool:
    """control, sweep or node.<valid node name>: the only queues a fleet process consumes."""
    if queue in (CONTROL_QUEUE, SWEEP_QUEUE):
        return True
    return queue.startswith(NODE_QUEUE_PREFIX) and is_node_name(queue[len(NODE_QUEUE_PREFIX):])


def worker_prefetch(queues: list[str], configured: int) -> int:
    """Sweep shards are long: a worker that takes them reserves one at a time (acks_late + 1)."""
    return 1 if SWEEP_QUEUE in queues else configured
