"""`powerfleet trigger` (the task API) and `powerfleet status`."""

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
    result = app.send_task(task, kwargs=kwargs, **options)
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
    from powerfleet.queues import node_queue

    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    workers = {name: sorted(q["name"] for q in qs) for name, qs in sorted(replies.items())}
    r = fleet_redis(app)
    from powerfleet.agent.presence import live_agents
    from powerfleet.metrics.queues import queue_depths

    consumed = [q for qs in workers.values() for q in qs]
    depths = queue_depths(r, [*consumed, *(node_queue(n) for n in config.nodes)])
    agents = sorted(live_agents(r))
    now = time.time()
    ticklog = TickLog(r)
    last, details, counts = ticklog.last_ticks(), ticklog.last_details(), ticklog.counts()
    ticks = {f: {"count": counts.get(f, 0), "last": last.get(f),
                 "age_s": (round(now - last[f], 3) if f in last else None),
                 "detail": details.get(f)} for f in TICK_FAMILIES}
    data = {"schema": "powerfleet.status/v1", "workers": workers, "agents": agents, "queues": depths, "ticks": ticks}
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
    q.add_column("consumer")
    served = set(consumed)
    for name, depth in depths.items():
        q.add_row(name, str(depth), "yes" if name in served else "NONE")
    console.print(q)
    console.print(f"live agents: {', '.join(agents) or '(none)'}")
    k = Table(title="ticks")
    k.add_column("family")
    k.add_column("ticks", justify="right")
    k.add_column("last tick (s ago)", justify="right")
    k.add_column("what it did")
    for f, info in ticks.items():
        k.add_row(f, str(info["count"]), "never" if info["age_s"] is None else f"{info['age_s']:.1f}",
                  info["detail"] or "")
    console.print(k)
