"""The one way a powerfleet task is declared: a name, an argument model, JSON in and out."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any, Callable, TypeVar

from celery import shared_task
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class TaskArgs(BaseModel):
    """Base for task argument models: unknown keys are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(TaskArgs):
    """For tasks that take no arguments: any argument is an error."""


class TaskInputError(ValueError):
    """The task's JSON arguments were invalid; raised before any work is done."""


def delivered_queue(request: Any) -> str | None:
    """The queue (routing key) a task's message actually arrived on."""
    return (request.delivery_info or {}).get("routing_key")


def args_model_of(task: Any) -> type[BaseModel] | None:
    """The argument model a task was declared with through ``fleet_task`` (None for others)."""
    return getattr(getattr(task, "run", None), "args_model", None)


def manual_fields_of(task: Any) -> frozenset[str] | None:
    """The argument fields a person may set through the task API (None: the task is internal).

    Declared once per task through ``fleet_task(manual=...)``; ``workers.app.FleetCelery.check_send``
    refuses a send by hand of an internal task, or with a field only the fleet sets."""
    return getattr(getattr(task, "run", None), "manual_fields", None)


def args_context(app: Any) -> dict[str, Any]:
    """What an argument model may check besides the JSON itself: the fleet config and the
    task clock's now (a window index must not lie after the newest closed window)."""
    # The app's own clock, not the process-wide port: a process may hold several apps (a test,
    # the CLI), and an earlier one's clock file must not decide what this one's "now" is.
    from powerfleet.clock import FileClock, SystemClock

    config = getattr(app, "fleet_config", None)
    clock_file = getattr(config, "clock_file", None)
    now = FileClock(clock_file).now() if clock_file else SystemClock().now()
    return {"config": config, "now": now}


def decode_args(task_name: str, model: type[M], args: tuple[Any, ...], kwargs: dict[str, Any],
                context: dict[str, Any] | None = None) -> M:
    """Validate ``kwargs`` as the JSON they travel as, in pydantic's strict mode.

    Strict, so a value is taken only as its own type: no bool for a number (``{"worker": true}``
    stored as 1 replica), no numeric string for a number (``"window": "5"``). Through JSON, so the
    same rule holds in the sender and in the worker that decodes the message, and a JSON array is
    what a tuple or list field takes."""
    if args:
        raise TaskInputError(f"{task_name}: takes keyword arguments only (a JSON object), got {len(args)} positional")
    try:
        text = json.dumps(kwargs, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TaskInputError(f"{task_name}: arguments are not JSON ({exc})") from None
    try:
        return model.model_validate_json(text, strict=True, context=context)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        msg = "unknown argument" if err["type"] == "extra_forbidden" else err["msg"]
        raise TaskInputError(f"{task_name}: {where}: {msg}") from None


def fleet_task(name: str, args_model: type[M], *, acks_late: bool, manual: bool | Iterable[str] = False,
               **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Declare a task taking ``args_model`` as keyword arguments and returning JSON.

    ``acks_late`` is required so each task states whether losing it matters: work that
    must not be lost is acknowledged after it returns (and must be idempotent).
    ``manual``: whether a person may send it through the task API (trigger, Flower): False (the
    default: only the fleet sends it), True (with any of its fields), or the names of the fields
    a person may set (the others are the fleet's own, e.g. what a tick adds).
    Input errors are not retried: the same arguments would fail the same way.
    """
    fields = frozenset(args_model.model_fields) if manual is True else (
        None if manual is False else frozenset(manual))
    if fields is not None and not fields <= set(args_model.model_fields):
        raise ValueError(f"{name}: manual fields {sorted(fields - set(args_model.model_fields))} are not arguments")

    def wrap(fn: Callable[..., Any]) -> Any:
        @functools.wraps(fn)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            params = decode_args(name, args_model, args, kwargs, args_context(self.app))
            result = fn(self, params)
            return result.model_dump(mode="json") if isinstance(result, BaseModel) else result

        run.args_model = args_model  # type: ignore[attr-defined]
        run.manual_fields = fields  # type: ignore[attr-defined]
        return shared_task(bind=True, name=name, acks_late=acks_late, **options)(run)

    return wrap
