"""`powerfleet trigger`: the task API from the command line (`status`: cli/status_cmd.py)."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import typer

from powerfleet.cli.context import fleet_app, fleet_config
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json, read_text_input
from powerfleet.workers.routes import NODE_QUEUE_PREFIX, is_fleet_queue


ARGS_HELP = ("Keyword arguments as one JSON object, checked against the task's own argument model "
             "before anything is sent: inline JSON, @FILE to read it from a file, or - for stdin. "
             "NaN and infinities are refused.")


def _read_args_text(raw: str) -> str:
    if raw == "-" or raw.startswith("@"):
        return read_text_input(raw.removeprefix("@"), "--args")
    return raw


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def parse_task_args(raw: str) -> dict[str, Any]:
    """The JSON object of keyword arguments named by --args (inline, @file or -)."""
    text = _read_args_text(raw)
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        fail(f"--args: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
    except ValueError as exc:  # NaN, Infinity, -Infinity
        fail(f"--args: {exc}: JSON has no NaN or infinities")
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
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, help="Seconds to wait for the result."),
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
    from powerfleet.workers.routes import RoutingError, family_of, route_task

    try:
        app.check_send(task, None, kwargs, task_api=True)
        routed = queue or route_task(task, (), kwargs, {})["queue"]  # type: ignore[index]
    except (*SEND_ERRORS, RoutingError) as exc:
        fail(str(exc))
    options: dict[str, Any] = {"queue": queue} if queue else {}
    if family_of(task) == "node":
        _require_live_agent(app, routed)
        # A node order nobody takes must not run hours later when an agent appears.
        options["expires"] = config.beat.reconcile_interval_s
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
    except CeleryTimeout:
        _forget(result)
        fail(f"{task} ({result.id}): no result within {timeout:g}s; is a worker consuming {routed}?", EXIT_FAILURE)
    state = result.state
    _forget(result)
    if state != "SUCCESS":
        fail(f"{task} ({result.id}) {state}: {type(value).__name__}: {value}", EXIT_FAILURE)
    print_json(value)


def _forget(result: Any) -> None:
    # Unsubscribe now, while the connection is open: left to AsyncResult.__del__ at exit it
    # runs on a torn-down connection and prints a traceback.
    try:
        result.backend.result_consumer.cancel_for(result.id)
    except Exception:  # noqa: BLE001 - best effort clean-up on the way out
        pass


def _require_live_agent(app: Any, queue: str) -> None:
    from powerfleet.agent.presence import live_agents
    from powerfleet.tasks.ports import fleet_redis

    node = queue[len(NODE_QUEUE_PREFIX):]
    if node not in live_agents(fleet_redis(app)):
        fail(f"no live agent serves node {node!r} (no heartbeat); nothing sent", EXIT_FAILURE)
