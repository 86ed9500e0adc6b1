"""The live power guard: ``powerfleet.power.guard(group)``, run by beat every
``power.guard_period_s`` per oversubscribed group (docs/power.md, "Live").

Thin: read the group's view (nodes, pod priorities; cached), the agents' reports and the guard's
memory from Redis, run one pure period (power/live.py), store the memory and the period's record
(power/authority.py: what the agents apply), send one ``powerfleet.agent.throttle`` overlay per node
(node-scoped, expiring after 1.5 periods: a wake-up, the record is the authority).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from pydantic import Field

from powerfleet.power import metrics as power_metrics
from powerfleet.power.admission import DRAW_KEY, MEMORY_KEY
from powerfleet.power.authority import RECORD_KEY, record_json
from powerfleet.power.guard import GuardSettings
from powerfleet.power.live import GuardMemory, GuardPeriod, guard_period
from powerfleet.power.telemetry import RedisTelemetry, TelemetryReader
from powerfleet.tasks.base import TaskArgs, TaskInputError, fleet_task
from powerfleet.tasks.ports import clock, fleet_redis

log = logging.getLogger("powerfleet.power")

THROTTLE_TASK = "powerfleet.agent.throttle"
LOCK_KEY = "powerfleet:power:guard:{group}:lock"
MEMORY_TTL_S = 86400  # a guard back after an outage resumes from what it sent last
_refused: dict[str, str | None] = {}  # group -> the refusal last logged (one line per change)
_topologies: dict[str, Any] = {}
_unreadable: dict[str, str] = {}  # group -> why its cluster view could not be read (one line per change)


class GuardArgs(TaskArgs):
    group: str = Field(min_length=1, max_length=253)


class GuardResult(TaskArgs):
    group: str
    at: float
    ran: bool = Field(description="false when another run for the group held its lock, or its view was unreadable")
    skipped: str | None = Field(default=None, description="why the period did nothing: the group's nodes and "
                                "pods could not be read, and no earlier view is held")
    mode: str | None = None
    measured_w: float | None = None
    limit_w: float
    refused: str | None = None
    overlays: list[str] = Field(default_factory=list, description="nodes sent an overlay")
    throttle: dict[str, float] = Field(default_factory=dict)
    stale: list[str] = Field(default_factory=list)


def guard_topology(app: Any) -> Any:
    """The group views the guard reads (power/topology.py), one per cluster access, kept per process."""
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.power.topology import ClusterTopology

    cfg = app.fleet_config
    key = cfg.budget.kubeconfig or ""
    if key not in _topologies:  # the budget's cluster access: the same nodes, labels and pods
        cluster = (KubeCluster.from_kubeconfig(key, component="powerfleet-power") if key
                   else KubeCluster.in_cluster(component="powerfleet-power"))
        priorities = {k: d.priority for k, d in cfg.budget.deployments.items()}
        _topologies[key] = ClusterTopology(cluster, cfg.budget.group_label, priorities,
                                           cfg.power.topology_refresh_s, clock)
    return _topologies[key]


def send_overlays(app: Any, period: GuardPeriod) -> list[str]:
    """One throttle message per node, pipelined through one producer; each expires when useless."""
    sent = []
    with app.producer_or_acquire() as producer, producer.batch(max_size=1000):
        for node, overlay in sorted(period.overlays.items()):
            app.send_task(THROTTLE_TASK, kwargs=overlay.model_dump(mode="json"), expires=overlay.ttl_s(),
                          producer=producer, ignore_result=True)
            sent.append(node)
    return sent


def run_guard(app: Any, group: str, limit_w: float, topology: Any, telemetry: TelemetryReader, r: Any,
              now: float) -> GuardResult:
    """One period for one group, with its I/O: the task's body, callable with other ports."""
    power = app.fleet_config.power
    settings = GuardSettings(period_s=power.guard_period_s, cap_ceiling=power.cap_ceiling)
    # One run per group at a time. Released at the end: the next period's run, due one period
    # later, must find it free; the expiry only covers a worker that died holding it.
    lock, token = LOCK_KEY.format(group=group), uuid.uuid4().hex
    if not r.set(lock, token, nx=True, px=max(1, int(settings.period_s * 1000))):
        return GuardResult(group=group, at=now, ran=False, limit_w=limit_w)
    try:
        return _period(app, settings, group, limit_w, topology, telemetry, r, now)
    finally:
        held = r.get(lock)
        if held is not None and (held.decode() if isinstance(held, bytes) else held) == token:
            r.delete(lock)


def _period(app: Any, settings: GuardSettings, group: str, limit_w: float, topology: Any,
            telemetry: TelemetryReader, r: Any, now: float) -> GuardResult:
    raw = r.get(MEMORY_KEY.format(group=group))
    try:
        memory = GuardMemory.from_json(json.loads(raw)) if raw else GuardMemory()
    except ValueError:
        memory = GuardMemory()
    view = topology.view(group)
    period = guard_period(settings, group, limit_w, view, telemetry.read(view.nodes), memory, now)
    r.set(MEMORY_KEY.format(group=group), json.dumps(period.memory.to_json(), allow_nan=False), ex=MEMORY_TTL_S)
    if period.refused != _refused.get(group):
        if period.refused:
            log.error("%s", period.refused)
        elif group in _refused:
            log.info("group %s: oversubscription no longer refused; guarding it", group)
        _refused[group] = period.refused
    if period.decision is not None and not period.decision.stale:
        # The measured figure admission reads (power/admission.py). Only a period in which every GPU
        # reported counts as measured: with one GPU counted at its safe cap the figure is partly a
        # guess, so none is written, and admission closes (telemetry_stale) two periods later.
        keep = int(app.fleet_config.power.admission_window_s / settings.period_s) + 1
        pipe = r.pipeline(transaction=False)
        pipe.lpush(DRAW_KEY.format(group=group), json.dumps([now, period.decision.measured_w], allow_nan=False))
        pipe.ltrim(DRAW_KEY.format(group=group), 0, keep - 1)
        pipe.expire(DRAW_KEY.format(group=group), MEMORY_TTL_S)
        pipe.execute()
    if period.overlays:
        # The record first (power/authority.py): an agent applies the record's overlay for its node, under
        # its epoch and revision, and nothing a message says; it expires when the period's overlays would.
        ttl = next(iter(period.overlays.values())).ttl_s()
        r.set(RECORD_KEY.format(group=group), record_json(period.overlays, period.memory.epoch, period.memory.revision,
                                                          settings.period_s, now), px=max(1, int(ttl * 1000)))
    sent = send_overlays(app, period)
    power_metrics.observe(group, limit_w, period)
    d = period.decision
    return GuardResult(group=group, at=now, ran=True, limit_w=limit_w, refused=period.refused, overlays=sent,
                       mode=d.mode if d else None, measured_w=d.measured_w if d else None,
                       throttle=dict(d.throttle) if d else {}, stale=list(d.stale) if d else [])


def draw_history(r: Any, group: str) -> list[tuple[float, float]]:
    """The group's measured draw per guard period over the admission window (for the ledger)."""
    from powerfleet.power.admission import parse_draw_history

    return parse_draw_history(r.lrange(DRAW_KEY.format(group=group), 0, -1))


@fleet_task("powerfleet.power.guard", GuardArgs, acks_late=False, manual=False)
def guard(self: Any, params: GuardArgs) -> GuardResult:
    """One guard period for one oversubscribed group (a lost run is replaced by the next period's)."""
    limit = self.app.fleet_config.budget.oversubscribed().get(params.group)
    if limit is None:
        raise TaskInputError(f"powerfleet.power.guard: group: {params.group!r} is not an oversubscribed group "
                             "(budget.groups.<g>.oversubscription > 1.0)")
    from kubernetes.config import ConfigException

    from powerfleet.broker.outage import first_line
    from powerfleet.cluster.ports import ClusterError

    try:
        # Built in the period: without cluster access yet (no kubeconfig, the API server not up) each
        # period says so in its result, the log has one line per cause, and the next period tries again.
        result = run_guard(self.app, params.group, limit, guard_topology(self.app),
                           RedisTelemetry(fleet_redis(self.app)), fleet_redis(self.app), clock.now())
    except (ClusterError, ConfigException) as exc:
        why = first_line(exc)
        if _unreadable.get(params.group) != why:
            log.warning("guard %s: cannot read the group's nodes and pods (%s); its agents keep the last overlay "
                        "until it expires, then take their safe caps", params.group, why)
        _unreadable[params.group] = why
        return GuardResult(group=params.group, at=clock.now(), ran=False, limit_w=limit,
                           skipped=f"the group's nodes and pods could not be read: {why}")
    if _unreadable.pop(params.group, None) is not None:
        log.info("guard %s: the group's view is readable again; guarding it", params.group)
    return result
