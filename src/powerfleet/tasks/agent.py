"""Node agent tasks, routed to ``node.<node>`` and run only by that node's agent worker.

The task is the thin edge: it checks that the pass is for this agent's node (refusing and
counting it otherwise, however the message got here) and hands it to the agent runtime of
this process (powerfleet.agent.runtime), which runs the pass (powerfleet.agent.reconcile).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import Field

from powerfleet.agent import runtime as agent_runtime
from powerfleet.power.overlay import Overlay
from powerfleet.tasks.base import TaskArgs, TaskInputError, delivered_queue, fleet_task
from powerfleet.tasks.ports import clock

log = logging.getLogger("powerfleet.agent")


class NodeArgs(TaskArgs):
    node: str = Field(min_length=1, max_length=253)


class WrongNode(TaskInputError):
    """A node task that reached an agent serving another node (or a worker that is no agent)."""


class NodeReconcileResult(TaskArgs):
    node: str
    worker: str | None
    queue: str | None
    at: float
    ran: bool = Field(description="false when a running pass held the agent past its wait: the tick's pass "
                                  "was deferred to the agent's pass thread, which runs it next")
    skipped: str | None = Field(default=None, description="why the pass changed nothing, when it did not run")
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    managed: list[str] = Field(default_factory=list)


@fleet_task("powerfleet.agent.reconcile", NodeArgs, acks_late=True, manual=True)
def reconcile_node(self: Any, params: NodeArgs) -> NodeReconcileResult:
    rt = agent_runtime.current()
    queue = delivered_queue(self.request)
    if rt is None:
        raise WrongNode(f"powerfleet.agent.reconcile for node {params.node!r} reached {self.request.hostname}, "
                        f"which is not a node agent; refused")
    if not rt.serves(params.node):
        rt.metrics.refused.labels(reason="other_node").inc()
        log.warning("refused agent.reconcile for node %s (arrived on %s); this agent serves %s",
                    params.node, queue, rt.node)
        raise WrongNode(f"powerfleet.agent.reconcile for node {params.node!r} refused by the agent of node "
                        f"{rt.node!r} (arrived on {queue})")
    report = rt.tick_pass()
    base = {"node": params.node, "worker": self.request.hostname, "queue": queue, "at": clock.now()}
    if report is None:
        return NodeReconcileResult(**base, ran=False, skipped="a pass was running; this tick's pass is deferred and runs next")
    return NodeReconcileResult(**base, ran=True, skipped=report.skipped,
                               gpus=[g.model_dump(mode="json") for g in report.gpus], managed=report.managed)


class ThrottleResult(TaskArgs):
    node: str
    group: str
    revision: int
    kept: bool = Field(description="false when an overlay of a newer revision was already held")
    ran: bool = Field(description="false when a running pass held the agent past its wait: the deferred pass "
                                  "that follows it enforces the overlay")
    refused: str | None = Field(default=None, description="why the message was refused (power/authority.py)")


# Internal: only the power guard sends overlays (a hand-sent one would set caps).
@fleet_task("powerfleet.agent.throttle", Overlay, acks_late=False, manual=False)
def throttle_node(self: Any, params: Overlay) -> ThrottleResult:
    """The power guard's overlay for this node (docs/power.md): the message names the group, epoch and
    revision; the overlay applied is the guard's record in Redis for them (power/authority.py), kept in
    the agent, then a pass, which enforces min(annotation cap, overlay) and reads the draw the guard
    sees next period. Early ack: the next period's overlay replaces a lost one, and a missed one is
    the fallback's business."""
    rt = agent_runtime.current()
    store = rt.agent.overlays if rt is not None else None
    if rt is None or store is None or not rt.serves(params.node):
        if rt is not None:
            rt.metrics.refused.labels(reason="other_node").inc()
        raise WrongNode(f"powerfleet.agent.throttle for node {params.node!r} reached {self.request.hostname}, "
                        f"which is not that node's agent; refused")
    overlay, why = _authorised(self.app, params)
    if overlay is None:
        store.refused.labels(reason=why).inc()
        log.warning("refused powerfleet.agent.throttle for group %s revision %d on node %s: %s (power/authority.py)",
                    params.group, params.revision, params.node, why)
        return ThrottleResult(node=params.node, group=params.group, revision=params.revision, kept=False, ran=False,
                              refused=why)
    kept = store.receive(overlay)
    report = rt.tick_pass() if kept else None
    return ThrottleResult(node=params.node, group=params.group, revision=params.revision, kept=kept,
                          ran=report is not None)


def _authorised(app: Any, params: Overlay) -> tuple[Overlay | None, str | None]:
    """The guard's record for the message's group, read from Redis now (power/authority.py)."""
    from powerfleet.power.authority import RECORD_KEY, verify
    from powerfleet.tasks.ports import fleet_redis

    cfg = app.fleet_config
    groups = cfg.budget.oversubscribed()
    raw = None
    if params.group in groups:
        try:
            raw = fleet_redis(app).get(RECORD_KEY.format(group=params.group))
        except Exception as exc:  # Redis unreachable: nothing to check against, the overlay is missed
            log.warning("cannot read the power guard's record for group %s (%s)", params.group,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return verify(params, raw, groups, cfg.power.guard_period_s)
