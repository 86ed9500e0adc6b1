"""`powerfleet trigger`: the task API from the command line (`status`: cli/status_cmd.py)."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import typer

from powerfleet.cli.context import fleet_app, fleet_config
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json, read_text_input
from powerfleet.queues import is_fleet_queue


ARGS_HELP = ("Keyword arguments as one JSON object, checked against the task's own argument model "
             "before anything is sent: inline JSON, @FILE to read it from a file, or - for stdin. "
             "NaN and infinities are refused.")


def _read_args_text(raw: str) -> str:
    if raw == "-" or raw.startswith("@"):
        return read_text_input(raw.removeprefix("@"), "--args")
    try:
        raw.encode("utf-8")  # argv bytes that are not UTF-8 arrive as lone surrogates
    except UnicodeEncodeError:
        fail("--args: not UTF-8 text")
    return raw


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def parse_task_args(raw: str) -> dict[str, Any]:
    """The JSON object of keyword arguments named by --args (inline, @file or -)."""
    from powerfleet.textinput import DuplicateKey, no_duplicate_keys, too_deep

    text = _read_args_text(raw)
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as exc:
        fail(f"--args: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
    except DuplicateKey as exc:
        fail(f"--args: {exc}")
    except ValueError as exc:  # NaN, Infinity, -Infinity
        fail(f"--args: {exc}: JSON has no NaN or infinities")
    except RecursionError:
        fail(f"--args: {too_deep('the JSON')}")
    if not isinstance(value, dict):
        fail(f"--args: must be a JSON object of keyword arguments, got {type(value).__name__}")
    return value


def trigger(
    ctx: typer.Context,
    task: str = typer.Argument(..., help="Task name, e.g. powerfleet.fleet.echo"),
    args: str = typer.Option("{}", "--args", help=ARGS_HELP),
    queue: Optional[str] = typer.Option(None, "--queue", help="Override the routing table's queue "
                                        "(control, sweep or node.<NAME>)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the result (default) or print the id."),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, max=86400.0,
                                 help="Seconds to wait for the result (at most a day)."),
) -> None:
    """Send any powerfleet task by name and print its JSON result.

    The arguments are validated against the task's argument model first: a wrong type, an
    unknown key or an illegal node name is one line and exit 2, and nothing is sent.
    A node task is refused when no live agent serves that node.
    """
    kwargs = parse_task_args(args)
    if queue is not None and not is_fleet_queue(queue):
        fail(f"--queue: {queue!r} is not a fleet queue (control, sweep or node.<node name>)")
    config = fleet_config(ctx)
    app = fleet_app(config)
    from powerfleet.workers.app import SEND_ERRORS
    from powerfleet.workers.manual import NoLiveAgent, check_manual_send

    try:
        options = check_manual_send(app, task, None, kwargs, {"queue": queue} if queue else {}, now=time.time(),
                                    node_expires_s=config.beat.reconcile_interval_s)
    except NoLiveAgent as exc:
        fail(str(exc), EXIT_FAILURE)
    except SEND_ERRORS as exc:
        fail(str(exc))
    routed = options["queue"]
    from powerfleet.broker.publish import BrokerRefusedWrite

    try:
        result = app.send_task(task, kwargs=kwargs, **options)
    except BrokerRefusedWrite as exc:
        fail(str(exc), EXIT_FAILURE)
    if not wait:
        print_json({"task_id": result.id, "task": task, "state": "SENT"})
        return
    from celery.exceptions import TimeoutError as CeleryTimeout

    try:
        value = result.get(timeout=timeout, propagate=False)
        state = result.state
    except CeleryTimeout:
        _forget(result)
        fail(f"{task} ({result.id}): no result within {timeout:g}s; is a worker consuming {routed}?", EXIT_FAILURE)
    except BROKER_LOST as exc:  # the broker died while we waited: the task may still run
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fail(f"{task} ({result.id}): broker lost while waiting for the result ({first}); it may still run: "
             f"`powerfleet status`, or Flower's /api/task/result/{result.id}", EXIT_FAILURE)
    _forget(result)
    if state != "SUCCESS":
        fail(f"{task} ({result.id}) {state}: {type(value).__name__}: {value}", EXIT_FAILURE)
    print_json(value)


def _broker_lost() -> tuple[type[BaseException], ...]:
    import redis
    from kombu.exceptions import OperationalError

    # Celery's result consumer ends its reconnect attempts with a RuntimeError ("Retry limit exceeded
    # while trying to reconnect to the Celery result store").
    return (redis.RedisError, OperationalError, OSError, RuntimeError)


BROKER_LOST = _broker_lost()


def _forget(result: Any) -> None:
    # Unsubscribe now, while the connection is open: left to AsyncResult.__del__ at exit it
    # runs on a torn-down connection and prints a traceback.
    try:
        result.backend.result_consumer.cancel_for(result.id)
    except Exception:  # noqa: BLE001 - best effort clean-up on the way out
        pass


