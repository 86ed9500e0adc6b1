"""Retune tasks: thin JSON wrappers over ``powerfleet.retune.control`` and ``.live``.

| task | queue | arguments (JSON object) |
|---|---|---|
| ``powerfleet.retune.tick`` | control | ``{}`` or ``{"now": epoch_s}`` (replays and tests) |
| ``powerfleet.retune.window`` | control | ``{"dgd", "window"}`` (+ ``leader``, ``term``, ``generation`` from the tick) |
| ``powerfleet.sweep.shard`` | sweep | ``{"sid", "spec"}`` (sent by the window step) |
| ``powerfleet.retune.harvest`` | control | ``{"sid"}`` |
| ``powerfleet.retune.apply`` / ``.rollback`` / ``.promote`` / ``.reset_window`` | control | ``{"dgd"}`` |
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery import signals
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.control import control_command
from pydantic import Field, ValidationInfo, field_validator

from powerfleet.beat.ticklog import TickLog
from powerfleet.cluster.leases import connect
from powerfleet.cluster.router import RouterClient
from powerfleet.queues import SWEEP_QUEUE
from powerfleet.retune import control, harvest, live, shutdown
from powerfleet.retune.context import Ports
from powerfleet.retune.fanin import ShardSpec
from powerfleet.retune.settings import SettingsError, closed_window, configured
from powerfleet.tasks.base import TaskArgs, fleet_task
from powerfleet.tasks.ports import clock, fleet_redis

log = logging.getLogger("powerfleet.retune")

_DGD = Field(min_length=1, max_length=253)
MAX_TICK_AHEAD_S = 60.0  # clock skew a replayed tick's "now" may have over the task clock
_clusters: dict[str | None, Any] = {}
STOP_JOIN_S = 10.0  # how long the last pass waits for the first
_consumers: dict[str, tuple[float, dict[str, bool]]] = {}


class TickArgs(TaskArgs):
    now: float | None = Field(None, ge=0, allow_inf_nan=False)

    @field_validator("now")
    @classmethod
    def _not_ahead(cls, now: float | None, info: ValidationInfo) -> float | None:
        """A replayed instant may lie in the past, not ahead of the task clock: a tick "now" far
        ahead would launch (and record as launched) windows that have not happened."""
        clock_now = (info.context or {}).get("now")
        if now is not None and clock_now is not None and now > clock_now + MAX_TICK_AHEAD_S:
            raise ValueError(f"now {now:g} lies more than {MAX_TICK_AHEAD_S:g} s ahead of the clock ({clock_now:g})")
        return now


class WindowArgs(TaskArgs):
    dgd: str = _DGD
    window: int = Field(ge=0)
    leader: str | None = None
    term: int | None = Field(None, ge=1)
    generation: str | None = None

    @field_validator("window")
    @classmethod
    def _closed(cls, k: int, info: ValidationInfo) -> int:
        """A window after the newest closed one is refused at send time and in the task (with
        the config and clock of ``tasks.base.args_context``): a window not yet over cannot be
        cut, and recording it as decided would refuse every real window before it."""
        ctx = info.context or {}
        cfg, now, dgd = getattr(ctx.get("config"), "retune", None), ctx.get("now"), info.data.get("dgd")
        if cfg is None or now is None or dgd is None:
            return k
        try:
            closed = closed_window(cfg, dgd, now)
        except ValueError:  # a bad schedule: the task answers invalid-settings
            return k
        if k > closed:
            raise ValueError(f"window {k} of {dgd!r} has not closed yet (the newest closed window is {closed})")
        return k


class DeploymentArgs(TaskArgs):
    dgd: str = _DGD


class HarvestArgs(TaskArgs):
    sid: str = Field(min_length=1, max_length=600)


class ShardArgs(TaskArgs):
    sid: str = Field(min_length=1, max_length=600)
    spec: ShardSpec


@dataclass
class _At:
    """The task's clock, with ``now`` pinned when the caller gave one (replays, tests)."""

    at: float | None

    def now(self) -> float:
        return self.at if self.at is not None else clock.now()

    def monotonic(self) -> float:
        return clock.monotonic()


@control_command(args=[("path", str)], signature="<path>")
def powerfleet_can_read(state: Any, path: str) -> dict[str, bool]:
    """Remote control command: can this worker read ``path`` (the retune trace directory)?"""
    return {"ok": os.path.isdir(path) and os.access(path, os.R_OK | os.X_OK)}


def _sweep_consumers(app: Any, trace_dir: str) -> dict[str, bool]:
    """Workers consuming ``sweep`` and whether each can read ``trace_dir`` (two broadcasts with a
    2 s reply window; a positive answer is cached 30 s per process)."""
    hit = _consumers.get(trace_dir)
    if hit is not None and time.monotonic() - hit[0] < 30:
        return hit[1]
    replies = app.control.inspect(timeout=2.0).active_queues() or {}
    names = sorted(w for w, qs in replies.items() if any(q.get("name") == SWEEP_QUEUE for q in qs or []))
    out = {n: False for n in names}
    if names:
        for reply in app.control.broadcast("powerfleet_can_read", arguments={"path": trace_dir}, destination=names,
                                           reply=True, timeout=2.0) or []:
            for worker, answer in reply.items():
                out[worker] = bool(isinstance(answer, dict) and answer.get("ok"))
    if any(out.values()):
        _consumers[trace_dir] = (time.monotonic(), out)
    return out


def ports_for(task: Any, at: float | None = None) -> Ports:
    app = task.app
    cfg = app.fleet_config.retune
    cluster = _clusters.get(cfg.kubeconfig)
    if cluster is None:
        cluster = _clusters[cfg.kubeconfig] = connect(cfg.kubeconfig)
    identity = task.request.hostname or "powerfleet"
    r = fleet_redis(app)
    return Ports(
        r=r, cluster=cluster, router=RouterClient(leader=identity), clock=_At(at),
        identity=identity,
        send=lambda name, kwargs, opts: app.send_task(name, kwargs=kwargs, **opts),
        sweep_consumers=lambda trace_dir: _sweep_consumers(app, trace_dir),
        stopping=lambda: shutdown.stopping(r, identity),
    )


def _run(task: Any, fn: Any, *args: Any, at: float | None = None) -> Any:
    ports = ports_for(task, at)
    try:
        return fn(task.app.fleet_config.retune, ports, *args)
    except SettingsError as exc:  # not retried: the same settings fail the same way
        return {"status": "invalid-settings", "error": str(exc)}
    finally:
        ports.router.close()


@fleet_task("powerfleet.retune.tick", TickArgs, acks_late=False, manual=True)
def retune_tick(self: Any, params: TickArgs) -> dict[str, Any]:
    cfg = self.app.fleet_config.retune
    now = _At(params.now).now()
    if not configured(cfg):
        deployments: list[dict[str, Any]] = []
    else:
        try:
            ports = ports_for(self, params.now)
        except Exception as exc:  # no kubeconfig/service account: say so, launch nothing
            deployments = [{"deployment": d, "status": "cluster-unavailable", "error": f"{type(exc).__name__}: {exc}"}
                           for d in configured(cfg)]
        else:
            try:
                deployments = control.tick(cfg, ports, now)
            finally:
                ports.router.close()
    launched = [{"dgd": d["deployment"], "window": k} for d in deployments for k in d.get("launched", [])]
    detail = ", ".join(f"launched {x['dgd']} window {x['window']}" for x in launched) or "no closed window to launch"
    TickLog(fleet_redis(self.app)).record("retune", now, self.request.origin, detail)
    return {"at": now, "launched": launched, "deployments": deployments}


# By hand ``dgd`` and ``window``; ``leader``/``term``/``generation`` are the tick's fencing.
@fleet_task("powerfleet.retune.window", WindowArgs, acks_late=True, manual=("dgd", "window"))
def retune_window(self: Any, params: WindowArgs) -> dict[str, Any]:
    return _run(self, lambda cfg, ports: live.launch_window(
        cfg, ports, params.dgd, params.window, leader=params.leader, term=params.term, generation=params.generation))


# A shard whose process died is retried (task_retry_on_worker_lost) after 1 s, not Celery's
# default 180 s, which would outlast most time budgets; it adopts or recomputes its result.
@fleet_task("powerfleet.sweep.shard", ShardArgs, acks_late=True, manual=False, default_retry_delay=1, max_retries=3)
def sweep_shard(self: Any, params: ShardArgs) -> dict[str, Any]:
    redelivered = bool((self.request.delivery_info or {}).get("redelivered")) or bool(self.request.retries)
    try:
        return _run(self, lambda cfg, ports: live.run_shard(ports, params.sid, params.spec, redelivered=redelivered))
    except SoftTimeLimitExceeded:
        # Reached during the replay, run_shard fails the shard's candidates and stores them. Reached
        # before it (building the ports, reading the sweep on a very loaded machine) nothing is
        # stored: an expected, reported outcome, not a crash; the harvest counts them missing.
        key = params.spec.key()
        log.warning("sweep %s shard %s: the soft time limit was reached before the replay; its candidates count as "
                    "missing at the harvest", params.sid, key)
        return {"status": "failed", "key": key, "redelivered": redelivered,
                "reason": "the soft time limit was reached before the replay"}


@fleet_task("powerfleet.retune.harvest", HarvestArgs, acks_late=True, manual=False)
def retune_harvest(self: Any, params: HarvestArgs) -> dict[str, Any]:
    return _run(self, harvest.harvest, params.sid)


@fleet_task("powerfleet.retune.apply", DeploymentArgs, acks_late=True, manual=True)
def retune_apply(self: Any, params: DeploymentArgs) -> dict[str, Any]:
    return _run(self, control.apply_now, params.dgd)


@fleet_task("powerfleet.retune.rollback", DeploymentArgs, acks_late=True, manual=True)
def retune_rollback(self: Any, params: DeploymentArgs) -> dict[str, Any]:
    return _run(self, control.rollback, params.dgd)


@fleet_task("powerfleet.retune.promote", DeploymentArgs, acks_late=True, manual=True)
def retune_promote(self: Any, params: DeploymentArgs) -> dict[str, Any]:
    return _run(self, control.promote, params.dgd)


@fleet_task("powerfleet.retune.reset_window", DeploymentArgs, acks_late=True, manual=True)
def retune_reset_window(self: Any, params: DeploymentArgs) -> dict[str, Any]:
    return _run(self, control.reset_window, params.dgd)


# The stop's two passes (retune.shutdown): the main process remembers its app at start; its
# children (forked later) inherit this but never act on it (the pid differs).
_stop: dict[str, Any] = {}


def _stop_ports(app: Any, cfg: Any, identity: str) -> Ports:
    cluster = connect(cfg.kubeconfig)
    return Ports(r=fleet_redis(app), cluster=cluster, router=RouterClient(), clock=clock, identity=identity,
                 send=lambda *a: None, sweep_consumers=lambda _dir: {})


def _stop_pass(step: Any) -> None:
    """Run one pass of the stop (best effort: no cluster or Redis, the Leases expire on their own)."""
    app, identity = _stop.get("app"), _stop.get("identity") or "powerfleet"
    cfg = getattr(getattr(app, "fleet_config", None), "retune", None)
    if cfg is None or not configured(cfg):
        return
    try:
        ports = _stop_ports(app, cfg, identity)
    except Exception:  # noqa: BLE001 - shutting down: never block the exit on the API server
        return
    try:
        step(cfg, ports)
    except Exception:  # noqa: BLE001
        pass
    finally:
        ports.router.close()
        getattr(ports.cluster, "close", lambda: None)()


@signals.worker_init.connect(weak=False)
def _remember_worker(sender: Any = None, **kw: Any) -> None:
    _stop.update(pid=os.getpid(), app=getattr(sender, "app", None), identity=getattr(sender, "hostname", None))
    # In the parent, before the pool forks: no child pays the cluster client's imports inside a
    # task's time limit (cluster/kube.py import_api_classes).
    from powerfleet.cluster.kube import import_api_classes

    import_api_classes()


@signals.worker_ready.connect(weak=False)
def _clear_stop_mark(sender: Any = None, **kw: Any) -> None:
    """A worker that starts under an identity that stopped before may lead again."""
    cfg = getattr(getattr(_stop.get("app"), "fleet_config", None), "retune", None)
    if _stop.get("pid") == os.getpid() and _stop.get("identity") and cfg is not None and configured(cfg):
        try:
            shutdown.clear(fleet_redis(_stop["app"]), _stop["identity"])
        except Exception:  # noqa: BLE001 - the mark expires on its own
            pass


@signals.worker_shutting_down.connect(weak=False)
def _release_when_the_stop_begins(sender: Any = None, **kw: Any) -> None:
    """SIGTERM: release the Leases now, on a thread (this runs inside the signal handler)."""
    if _stop.get("pid") == os.getpid() and "begin" not in _stop:
        _stop["begin"] = threading.Thread(target=_stop_pass, args=(shutdown.begin,), name="retune-stop", daemon=True)
        _stop["begin"].start()


@signals.worker_shutdown.connect(weak=False)
def _release_leases(sender: Any = None, **kw: Any) -> None:
    """After the drain: release what a running task claimed meanwhile, and clear the mark."""
    if _stop.get("pid") != os.getpid():
        return
    begun = _stop.get("begin")
    if begun is not None:
        begun.join(timeout=STOP_JOIN_S)
    _stop_pass(shutdown.finish)
