"""The Celery app factory: one FleetConfig in, one configured Celery app out.

Everything that differs between powerfleet processes (which queues a worker consumes,
whether it runs beat) is a command-line choice; everything else comes from here so that
every process agrees on serialisation, routing, acks and limits.
"""

from __future__ import annotations

import json
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from powerfleet.broker.celery_options import (backend_socket_settings, redbeat_settings, tls_settings, transport_class,
                                             transport_options)
from powerfleet.broker.publish import noreplicas_is_unavailable, retry_noreplicas
from powerfleet.config import FleetConfig
from powerfleet.queues import CONTROL_QUEUE, SWEEP_QUEUE, TICK_FAMILIES, family_of, node_queue, route_task
from powerfleet.tasks.base import TaskInputError, args_context, args_model_of, decode_args, manual_fields_of

# Modules that define tasks; imported by create_app so every process (worker, beat,
# CLI, Flower) knows the same task names.
TASK_MODULES = (
    "powerfleet.tasks.fleet",
    "powerfleet.tasks.agent",
    "powerfleet.tasks.budget",
    "powerfleet.tasks.retune",
    "powerfleet.tasks.power",
)


class UnknownTask(ValueError):
    """A task name that is not one of the fleet's own."""


class NotManual(TaskInputError):
    """A send by hand of an internal task, or with a field only the fleet sets (docs/operations.md)."""


# What a sender may be refused with before anything reaches the broker.
SEND_ERRORS: tuple[type[Exception], ...] = (UnknownTask, TaskInputError)


class FleetCelery(Celery):
    """A Celery app that carries the FleetConfig it was built from.

    Every message leaves through ``send_task`` (Task.apply_async, canvases, the CLI's
    `trigger` and Flower's task API all call it), so that is where a task name and its
    JSON arguments are checked: a bad send fails in the sender with one clear line and
    nothing reaches Redis, instead of failing later in a worker, or never (a node queue
    nobody consumes).
    """

    fleet_config: FleetConfig
    broker_url_resolved: str

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        self.check_send(name, args, kwargs)
        send = super().send_task
        # A master short of in-sync replicas (min-replicas-to-write) refuses writes for a while.
        return retry_noreplicas(lambda: send(name, args, kwargs, **options), f"publish {name}",
                                self.fleet_config.broker.noreplicas_retry_s)

    def check_send(self, name: str, args: Any, kwargs: Any, *, task_api: bool = False) -> None:
        """Raise one of SEND_ERRORS unless ``name`` may be sent with these arguments.

        ``task_api``: a send by hand (trigger, Flower) may name only the fleet's own manual tasks,
        with only their manual fields (``fleet_task(manual=...)``); inside the fleet Celery's
        housekeeping tasks (chord unlock) pass.
        """
        if name.startswith("celery.") and not task_api:
            return
        task = self.tasks.get(name) if name.startswith("powerfleet.") else None
        model = args_model_of(task) if task is not None else None
        if model is None:
            known = ", ".join(sorted(t for t in self.tasks if t.startswith("powerfleet.")))
            raise UnknownTask(f"unknown task {name!r}; known tasks: {known}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TaskInputError(f"{name}: arguments must be a JSON object, got {type(kwargs).__name__}")
        kwargs = kwargs or {}
        if task_api:
            _refuse_internal(self, name, task, kwargs)
        try:
            _refuse_non_finite(name, kwargs)
            decode_args(name, model, tuple(args or ()), kwargs, args_context(self))
        except RecursionError:
            raise TaskInputError(f"{name}: arguments are nested too deeply") from None


def celery_settings(config: FleetConfig, broker_url: str) -> dict[str, Any]:
    vt = config.broker.visibility_timeout_s
    backend = config.broker.result_backend or broker_url
    transport = {"visibility_timeout": vt, "socket_timeout": 10, "health_check_interval": 10,
                 **transport_options(config.broker, broker_url)}
    queues = [Queue(CONTROL_QUEUE, Exchange(CONTROL_QUEUE), routing_key=CONTROL_QUEUE),
              Queue(SWEEP_QUEUE, Exchange(SWEEP_QUEUE), routing_key=SWEEP_QUEUE)]
    queues += [Queue(node_queue(n), Exchange(node_queue(n)), routing_key=node_queue(n)) for n in config.nodes]
    return {
        "broker_url": broker_url,
        "result_backend": backend,
        # JSON only: a pickled message is refused by the worker before anything runs.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_queues": queues,
        "task_default_queue": CONTROL_QUEUE,
        "task_routes": (route_task,),
        "task_create_missing_queues": True,
        # Set in all three places: the shortest visibility timeout on a broker wins (celery#7651).
        "broker_transport_options": transport,
        **transport_class(broker_url),
        **backend_socket_settings(backend),
        "result_backend_transport_options": {"visibility_timeout": vt, **transport_options(config.broker, backend)},
        "visibility_timeout": vt,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "result_expires": config.broker.result_expires_s,
        "result_extended": True,
        # No STARTED write per task: it is an extra backend round trip on every task
        # (bench/dispatch.py); long tasks that want it set track_started themselves.
        "task_track_started": False,
        # A worker process that dies mid-task counts as a retry (bounded), not a silent ack.
        "task_retry_on_worker_lost": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_prefetch_multiplier": config.prefetch_multiplier,
        # Task events cost a publish per state change. Flower switches them on over the
        # control channel while it runs (its enable_events option), so they are off otherwise.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "task_annotations": (_TimeLimitAnnotation(config),),
        "timezone": "UTC",
        "enable_utc": True,
        # Beat: RedBeat keeps the schedule in Redis and holds a lock, so a second beat waits.
        "beat_scheduler": "powerfleet.beat.scheduler:FleetScheduler",
        **redbeat_settings(config.broker, broker_url),
        **tls_settings(config.broker, broker_url, backend),
        "redbeat_key_prefix": "powerfleet:redbeat:",
        "redbeat_lock_timeout": config.beat.lock_timeout_s,
        "beat_max_loop_interval": config.beat.max_loop_interval_s,
        "beat_schedule": beat_schedule(config),
    }


def _refuse_internal(app: Any, name: str, task: Any, kwargs: dict[str, Any]) -> None:
    manual = manual_fields_of(task)
    if manual is None:
        sendable = ", ".join(sorted(t for t, v in app.tasks.items() if manual_fields_of(v) is not None))
        raise NotManual(f"{name}: an internal task (only the fleet sends it), refused by the task API; "
                        f"manual tasks: {sendable}")
    internal = sorted(k for k in kwargs if k not in manual and k in args_model_of(task).model_fields)
    if internal:
        shown = ", ".join(sorted(manual)) or "none"
        raise NotManual(f"{name}: {internal[0]}: set only by the fleet itself, not through the task API "
                        f"(a person may set: {shown})")


def _refuse_non_finite(name: str, kwargs: dict[str, Any]) -> None:
    # Python's json would write NaN/Infinity, which are not JSON: other readers choke on them.
    try:
        json.dumps(kwargs, allow_nan=False)
    except ValueError:
        raise TaskInputError(f"{name}: arguments contain NaN or an infinity, which JSON does not allow") from None
    except TypeError as exc:
        raise TaskInputError(f"{name}: arguments are not JSON ({exc})") from None


class _TimeLimitAnnotation:
    """Celery task annotation giving each powerfleet task its family's soft/hard limits."""

    def __init__(self, config: FleetConfig) -> None:
        self._limits = {"control": config.limits.control, "sweep": config.limits.sweep,
                        "node": config.limits.node}

    def annotate(self, task: Any) -> dict[str, float] | None:
        name = getattr(task, "name", "")
        if not name.startswith("powerfleet."):
            return None
        lim = self._limits[family_of(name)]
        return {"soft_time_limit": lim.soft_s, "time_limit": lim.hard_s}




def beat_schedule(config: FleetConfig) -> dict[str, dict[str, Any]]:
    intervals = {
        "reconcile": config.beat.reconcile_interval_s,
        "budget": config.beat.budget_interval_s,
        "retune": config.beat.retune_interval_s,
    }
    schedule = {
        f"powerfleet-{family}-tick": {
            "task": task,
            "schedule": intervals[family],
            # A tick that waited longer than its interval is superseded by the next one.
            "options": {"expires": intervals[family]},
        }
        for family, task in TICK_FAMILIES.items()
    }
    # The power guard: one entry per oversubscribed group (none unless a group opts in), unless
    # its own process keeps the periods (power.guard_runner: process; `powerfleet power guard`).
    period = config.power.guard_period_s
    for group in config.budget.oversubscribed() if config.power.guard_runner == "beat" else ():
        schedule[f"powerfleet-power-guard-{group}"] = {
            "task": "powerfleet.power.guard", "schedule": period, "kwargs": {"group": group},
            "options": {"expires": period}}
    return schedule


def create_app(config: FleetConfig, broker_url: str | None = None, main: str = "powerfleet",
               with_tasks: bool = True) -> FleetCelery:
    """``with_tasks=False``: an app that only talks to the broker (status: the task modules
    pull in the Kubernetes client, numpy and the simulator, about a second of imports)."""
    url = broker_url or config.broker.url
    if url is None:
        raise ValueError("no broker URL: pass broker_url (e.g. from EmbeddedRedis) or set broker.url")
    from powerfleet.broker.transport import use_fleet_redis_transport
    from powerfleet.workers.outcomes import FleetTask

    use_fleet_redis_transport()  # before any connection: a channel closed after collect() (broker/transport.py)
    app = FleetCelery(main, set_as_current=True, task_cls=FleetTask)
    app.config_from_object(celery_settings(config, url))
    from powerfleet.broker.outage import fleet_result_backends

    # Results stored through a short outage in one line per try (broker/outage.py); per app.
    app.loader.override_backends = fleet_result_backends()
    app.fleet_config = config
    app.broker_url_resolved = url
    # `celery beat` builds app.Beat: ours stops between passes, never inside a publish.
    app.Beat = app.subclass_with_self("powerfleet.beat.service:FleetBeat")  # type: ignore[method-assign]
    from powerfleet.broker.steps import BrokerWatch, follow_in_pool_children  # here: see broker.metrics

    app.steps["consumer"].add(BrokerWatch)
    follow_in_pool_children(app)
    noreplicas_is_unavailable()  # a master short of replicas is an outage to wait out, not a crash
    if config.clock_file:
        from powerfleet.clock import FileClock
        from powerfleet.tasks import ports

        ports.clock.use(FileClock(config.clock_file))
    import importlib

    for module in TASK_MODULES if with_tasks else ():
        importlib.import_module(module)
    app.conf.include = list(TASK_MODULES) if with_tasks else []
    app.finalize(auto=True)
    return app
