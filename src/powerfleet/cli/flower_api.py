"""Flower for watching, not for stopping: its task API checks a send as `powerfleet trigger` does,
and its worker-control endpoints are off unless ``flower.allow_worker_control`` is set.

Flower publishes from a thread pool and turns any exception there into an empty HTTP 500,
and it passes every other field of a request body to Celery unchecked (a ``queue`` nobody
reads, ``countdown: "abc"``, ``serializer: pickle``). Flower reads every task API request's
arguments through ``BaseTaskHandler.get_task_args``; checking there
(``powerfleet.workers.manual.check_manual_send``, the check `trigger` uses) answers 400 with
our one-line message before anything is published.

One call to a worker-control endpoint shuts an agent down (it restores default caps on the
way out) or moves a consumer; Flower's own ``read_only`` switch would also turn off the task
API the fleet needs, so those handlers alone answer 403 here.
"""

from __future__ import annotations

import time
from typing import Any

# The columns of Flower's task list (its ``tasks_columns``; Flower's default has no result). With the
# result beside the state, a pass that was skipped (a result leading with ``"summary": "skipped: ..."``,
# workers/outcomes.py) reads as one, although its state is SUCCESS like a pass that acted.
TASKS_COLUMNS = "name,uuid,state,result,received,runtime,worker"
# Everything in Flower that stops, reshapes or re-limits a worker or a task.
CONTROL_HANDLERS = ("WorkerShutDown", "WorkerPoolRestart", "WorkerPoolGrow", "WorkerPoolShrink",
                    "WorkerPoolAutoscale", "WorkerQueueAddConsumer", "WorkerQueueCancelConsumer",
                    "TaskRevoke", "TaskTimout", "TaskRateLimit")
REFUSED = "worker control through Flower is off (flower.allow_worker_control: false); Flower is for watching"


def install_task_api_checks(allow_worker_control: bool = False) -> None:
    from flower.api import control, tasks
    from flower.api.tasks import BaseTaskHandler
    from tornado.web import HTTPError

    from powerfleet.workers.app import SEND_ERRORS
    from powerfleet.workers.manual import check_manual_send

    original = BaseTaskHandler.get_task_args
    if getattr(original, "_powerfleet_checked", False):
        return

    def get_task_args(self: Any) -> tuple[Any, Any, Any]:
        try:
            args, kwargs, options = original(self)
        except RecursionError:  # tornado's json_decode on a deeply nested body
            raise HTTPError(400, "request body is nested too deeply") from None
        taskname = self.path_args[0] if self.path_args else ""
        timeout = options.pop("timeout", None) if isinstance(self, tasks.TaskApply) else None
        try:
            checked = check_manual_send(self.capp, taskname, args, kwargs, options, now=time.time(),
                                        node_expires_s=self.capp.fleet_config.beat.reconcile_interval_s)
            if timeout is not None:
                checked["timeout"] = _timeout(taskname, timeout)
        except (*SEND_ERRORS, RecursionError) as exc:
            raise HTTPError(400, _one_line(exc)) from None
        return args, kwargs, checked

    get_task_args._powerfleet_checked = True  # type: ignore[attr-defined]
    BaseTaskHandler.get_task_args = get_task_args  # type: ignore[method-assign]
    if not allow_worker_control:
        for name in CONTROL_HANDLERS:
            _refuse(getattr(control, name))
        _refuse(tasks.TaskAbort)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "arguments are nested too deeply"
    return " ".join(str(exc).split())


def _refuse(handler: type) -> None:
    from tornado.web import HTTPError

    base_prepare = handler.prepare

    def prepare(self: Any) -> None:
        base_prepare(self)  # Flower's own check that the API is enabled at all
        raise HTTPError(403, REFUSED)

    handler.prepare = prepare  # type: ignore[method-assign]


def _timeout(taskname: str, value: Any) -> float:
    """Flower's apply waits this long for the result, holding a thread of its pool."""
    from powerfleet.workers.manual import MAX_DELAY_S, SendRefused

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_DELAY_S:
        raise SendRefused(f"{taskname}: timeout: must be a number of seconds above 0 and at most {MAX_DELAY_S:g}")
    return float(value)
