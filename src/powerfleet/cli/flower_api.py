"""Flower's task API checks a send the way `powerfleet trigger` does.

Flower publishes from a thread pool and turns any exception there into an empty HTTP 500,
so a node task without a node, or a misspelt task name, would only show in Flower's log (or
not at all: `send-task` accepts any name). Flower reads every task API request's arguments
through ``BaseTaskHandler.get_task_args``; checking there answers 400 with our one-line
message before anything is published.
"""

from __future__ import annotations

from typing import Any


def install_task_api_checks() -> None:
    from flower.api.tasks import BaseTaskHandler
    from tornado.web import HTTPError

    from powerfleet.workers.app import SEND_ERRORS
    from powerfleet.queues import RoutingError, route_task

    original = BaseTaskHandler.get_task_args
    if getattr(original, "_powerfleet_checked", False):
        return

    def get_task_args(self: Any) -> tuple[Any, Any, Any]:
        args, kwargs, options = original(self)
        taskname = self.path_args[0] if self.path_args else ""
        try:
            self.capp.check_send(taskname, args, kwargs, task_api=True)
            if "queue" not in options:
                route_task(taskname, args, kwargs, options)
        except (*SEND_ERRORS, RoutingError) as exc:
            raise HTTPError(400, str(exc)) from None
        return args, kwargs, options

    get_task_args._powerfleet_checked = True  # type: ignore[attr-defined]
    BaseTaskHandler.get_task_args = get_task_args  # type: ignore[method-assign]
