"""`powerfleet status`: workers and their queues, queue depths, live agents, the last tick of
each family, and the broker (its master, replicas and last failover).

Celery's `inspect` waits its whole timeout for replies, since it cannot know how many workers
exist. Every fleet worker announces itself in Redis (powerfleet.broker.steps), so status
asks for exactly that many replies and answers as soon as they are in; only a worker that
announced itself and does not answer (something is wrong) makes it wait out ``--timeout``.

Node agents are not asked: the agent of node X is the worker ``agent@X`` and consumes
``node.X`` only (agent/worker.py), so its announcement says all an inspect reply would. Asking
every agent made status wait for one reply per node: 11.6 s at 10,000 agents (bench/scale.py).
"""

from __future__ import annotations

import time
from typing import Any

import typer

from powerfleet.cli.context import fleet_app, fleet_config
from powerfleet.cli.errors import print_json


def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    timeout: float = typer.Option(3.0, "--timeout", min=0.1, max=600.0,
                                  help="Seconds to wait for a worker that announced itself but has not answered."),
) -> None:
    """Workers and their queues, queue depths, ticks, and the broker's master, replicas and last failover."""
    config = fleet_config(ctx)
    app = fleet_app(config, with_tasks=False)  # it sends no task: skip a second of imports
    from powerfleet.agent.drain import pending_drains
    from powerfleet.agent.presence import live_agents
    from powerfleet.beat.ticklog import TickLog
    from powerfleet.broker.steps import live_workers
    from powerfleet.broker.topology import describe
    from powerfleet.metrics.queues import queue_depths
    from powerfleet.power.authority import in_force
    from powerfleet.tasks.ports import fleet_redis
    from powerfleet.queues import TICK_FAMILIES, agent_worker_node, node_queue

    r = fleet_redis(app)
    announced = live_workers(r)
    agents = {w: [node_queue(n)] for w in announced if (n := agent_worker_node(w))}
    others = announced - set(agents)
    workers = {**agents, **(inspected_queues(app, others, timeout) if others or not announced else {})}
    workers = dict(sorted(workers.items()))
    consumed = [q for qs in workers.values() for q in qs]
    depths = queue_depths(r, [*consumed, *(node_queue(n) for n in config.nodes)])
    now = time.time()
    ticklog = TickLog(r)
    last, details, counts = ticklog.last_ticks(), ticklog.last_details(), ticklog.counts()
    ticks = {f: {"count": counts.get(f, 0), "last": last.get(f),
                 "age_s": (round(now - last[f], 3) if f in last else None),
                 "detail": details.get(f)} for f in TICK_FAMILIES}
    data = {"schema": "powerfleet.status/v1", "workers": workers,
            "workers_not_answering": sorted(announced - set(workers)), "agents": sorted(live_agents(r)),
            "queues": depths, "ticks": ticks, "drains": pending_drains(r),
            "broker": describe(app.broker_url_resolved, config.broker, timeout_s=min(timeout, 2.0)),
            "power_overlays": in_force(r, config.budget.oversubscribed())}
    if as_json:
        print_json(data)
        return
    _print_human(data, set(consumed))


def inspected_queues(app: Any, announced: set[str], timeout: float) -> dict[str, list[str]]:
    """Worker -> the queues it consumes, asked of the ``announced`` workers (of all, when none is)."""
    asked = app.control.inspect(timeout=timeout, destination=sorted(announced) or None, limit=len(announced) or None)
    return {name: sorted(q["name"] for q in qs) for name, qs in (asked.active_queues() or {}).items()}


def _print_human(data: dict[str, Any], served: set[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="workers")
    t.add_column("worker")
    t.add_column("queues")
    for w, qs in data["workers"].items():
        t.add_row(w, ", ".join(qs))
    for w in data["workers_not_answering"]:
        t.add_row(w, "NOT ANSWERING (announced itself, no reply)")
    if not data["workers"] and not data["workers_not_answering"]:
        t.add_row("(none answered)", "")
    console.print(t)
    q = Table(title="queues")
    q.add_column("queue")
    q.add_column("depth", justify="right")
    q.add_column("consumer")
    for name, depth in data["queues"].items():
        q.add_row(name, str(depth), "yes" if name in served else "NONE")
    console.print(q)
    console.print(f"live agents: {', '.join(data['agents']) or '(none)'}")
    console.print(f"pending drains: {drains_line(data['drains'])}", highlight=False)
    k = Table(title="ticks")
    k.add_column("family")
    k.add_column("ticks", justify="right")
    k.add_column("last tick (s ago)", justify="right")
    k.add_column("what it did")
    for f, info in data["ticks"].items():
        k.add_row(f, str(info["count"]), "never" if info["age_s"] is None else f"{info['age_s']:.1f}",
                  info["detail"] or "")
    console.print(k)
    console.print(broker_line(data["broker"]), highlight=False)
    for line in overlay_lines(data["power_overlays"]):
        console.print(line, highlight=False)


def overlay_lines(overlays: list[dict[str, Any]]) -> list[str]:
    """The power guard's overlays in force, one line per node (power/authority.py's ``in_force``)."""
    if not overlays:
        return ["power overlays: none in force"]
    return [f"power overlay on {o['node']}: group {o['group']}, {o['throttled']} of {o['gpus']} GPUs throttled, "
            f"from {o['source']} revision {o['revision']}, expires in "
            f"{'?' if o['expires_in_s'] is None else format(o['expires_in_s'], '.1f')} s" for o in overlays]


def drains_line(drains: dict[str, dict[str, Any]]) -> str:
    def one(node: str, d: dict[str, Any]) -> str:
        left = "no expiry" if d["expires_in_s"] is None else f"expires in {d['expires_in_s']} s"
        return f"{node} ({'drained' if d['answered'] else 'not answered yet'}, {left})"

    return "; ".join(one(n, d) for n, d in drains.items()) or "(none)"


def broker_line(b: dict[str, Any]) -> str:
    """The broker in one line: mode, master, replicas and their links, last failover."""
    if "error" in b:
        tail = f"; {quorum_words(b)}" if b["mode"] == "sentinel" else ""
        return f"broker ({b['mode']}): {b['error']}{tail}"
    replicas = ", ".join(f"{x['address']} ({'DOWN' if 'down' in x['flags'] else 'link ' + (x['link'] or '?')})"
                         for x in b["replicas"]) or "none"
    if b["mode"] == "standalone":
        return f"broker: one Redis ({b.get('role')}); replicas: {replicas}"
    lf = b["last_failover"]
    failover = "never" if lf is None else f"{lf['age_s']:.0f} s ago (failover epoch {lf['epoch']})"
    return (f"broker: Sentinel master {b['master_name']!r} at {b['master']} ({b['master_flags']}; "
            f"{b['sentinels']} Sentinels, quorum {b['quorum']}); replicas: {replicas}; last failover: {failover}; "
            f"{quorum_words(b)}")


def quorum_words(b: dict[str, Any]) -> str:
    """How many Sentinels answered and whether a failover can happen (broker.topology's quorum fields)."""
    if "sentinels_answered" not in b:
        return "quorum not checked"
    said = f"{b['sentinels_answered']} of {b['sentinels_configured']} Sentinels answered"
    if b.get("failover_possible"):
        return f"{said}, a failover can be authorised"
    return f"WARNING: {said}, NO failover can happen ({b.get('quorum_detail', 'no quorum')})"
