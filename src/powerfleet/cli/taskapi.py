"""`powerfleet trigger` (the task API) and `powerfleet status`."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import typer

from powerfleet.cli.context import fleet_app, fleet_config
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json


def _parse_args(raw: str) -> tuple[list[Any], dict[str, Any]]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        fail(f"--args: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
    if isinstance(value, dict):
        return [], value
    if isinstance(value, list):
        return value, {}
    fail(f"--args: must be a JSON object (keyword arguments) or array, got {type(value).__name__}")


def trigger(
    ctx: typer.Context,
    task: str = typer.Argument(..., help="Task name, e.g. powerfleet.fleet.echo"),
    args: str = typer.Option("{}", "--args", help="JSON object of keyword arguments (or an array)."),
    queue: Optional[str] = typer.Option(None, "--queue", help="Override the routing table's queue."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the result (default) or print the id."),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, help="Seconds to wait for the result."),
) -> None:
    """Send any powerfleet task by name and print its JSON result."""
    positional, kwargs = _parse_args(args)
    config = fleet_config(ctx)
    app = fleet_app(config)
    if task not in app.tasks or not task.startswith("powerfleet."):
        known = ", ".join(sorted(t for t in app.tasks if t.startswith("powerfleet.")))
        fail(f"unknown task {task!r}; known tasks: {known}")
    from powerfleet.workers.routes import RoutingError

    options: dict[str, Any] = {"queue": queue} if queue else {}
    try:
        result = app.send_task(task, args=positional, kwargs=kwargs, **options)
    except RoutingError as exc:
        fail(str(exc))
    if not wait:
        print_json({"task_id": result.id, "task": task, "state": "SENT"})
        return
    from celery.exceptions import TimeoutError as CeleryTimeout

    try:
        value = result.get(timeout=timeout, propagate=False)
    except CeleryTimeout:
        fail(f"{task} ({result.id}): no result within {timeout:g}s; is a worker consuming its queue?", EXIT_FAILURE)
    if result.state != "SUCCESS":
        fail(f"{task} ({result.id}) {result.state}: {type(value).__name__}: {value}", EXIT_FAILURE)
    print_json(value)


def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    timeout: float = typer.Option(3.0, "--timeout", min=0.1, help="Seconds to wait for worker replies."),
) -> None:
    """Workers and their queues, queue depths, and the last tick of each family."""
    config = fleet_config(ctx)
    app = fleet_app(config)
    from powerfleet.beat.ticklog import TickLog
    from powerfleet.tasks.ports import fleet_redis
    from powerfleet.workers.app import TICK_FAMILIES
    from powerfleet.workers.routes import CONTROL_QUEUE, SWEEP_QUEUE, node_queue

    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    workers = {name: sorted(q["name"] for q in qs) for name, qs in sorted(replies.items())}
    queue_names = {CONTROL_QUEUE, SWEEP_QUEUE, *(node_queue(n) for n in config.nodes)}
    for qs in workers.values():
        queue_names.update(q for q in qs if not q.endswith(".dq2"))
    r = fleet_redis(app)
    # LLEN ourselves: Flower only reports queues that live workers consume.
    depths = {q: int(r.llen(q)) for q in sorted(queue_names)}
    now = time.time()
    ticklog = TickLog(r)
    last, details = ticklog.last_ticks(), ticklog.last_details()
    ticks = {f: {"last": last.get(f), "age_s": (round(now - last[f], 3) if f in last else None),
                 "detail": details.get(f)} for f in TICK_FAMILIES}
    data = {"schema": "powerfleet.status/v1", "workers": workers, "queues": depths, "ticks": ticks}
    if as_json:
        print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="workers")
    t.add_column("worker")
    t.add_column("queues")
    for w, qs in workers.items():
        t.add_row(w, ", ".join(qs))
    if not workers:
        t.add_row("(none answered)", "")
    console.print(t)
    q = Table(title="queues")
    q.add_column("queue")
    q.add_column("depth", justify="right")
    for name, depth in depths.items():
        q.add_row(name, str(depth))
    console.print(q)
    k = Table(title="ticks")
    k.add_column("family")
    k.add_column("last tick (s ago)", justify="right")
    k.add_column("what it did")
    for f, info in ticks.items():
        k.add_row(f, "never" if info["age_s"] is None else f"{info['age_s']:.1f}", info["detail"] or "")
    console.print(k)
