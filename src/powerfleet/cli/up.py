"""`powerfleet up` (the whole fleet in the foreground) and `powerfleet demo`."""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import typer

from powerfleet.cli.context import export_config_path, fleet_config, redact
from powerfleet.cli.errors import EXIT_FAILURE, fail
from powerfleet.config import FleetConfig


def _start_fleet(ctx: typer.Context, config: FleetConfig, log_dir: Path):  # type: ignore[no-untyped-def]
    from powerfleet.broker.embedded import BrokerUnavailable
    from powerfleet.workers.launcher import Launcher

    export_config_path(ctx)
    launcher = Launcher(log_dir=log_dir)
    if config.broker.url is None:
        try:
            url = launcher.start_embedded_broker()
        except BrokerUnavailable as exc:
            fail(str(exc))
        typer.echo(f"embedded redis-server at {url}", err=True)
    else:
        url = config.broker.url
        typer.echo(f"broker {redact(url)}", err=True)
    metrics = MetricsPorts(config.metrics.port)
    launcher.spawn("worker", "worker", "--queues", "control,sweep", "--name", "fleet@up", env=metrics.env("worker"))
    for node in config.nodes:
        launcher.spawn(f"agent-{node}", "agent", "--node", node, env=metrics.env(f"agent-{node}"))
    launcher.spawn("beat", "beat", env=metrics.env("beat"))
    launcher.spawn("flower", "flower")
    if metrics.assigned:
        typer.echo("metrics: " + ", ".join(f"{name} http://{config.metrics.address}:{port}/metrics"
                                           for name, port in metrics.assigned.items()), err=True)
    return launcher, url


class MetricsPorts:
    """One /metrics port per fleet process: ``metrics.port`` is the base, each process the next.

    Every process of `up` reads the same config, so without this they would all bind the
    same port and all but the first would die.
    """

    def __init__(self, base: int) -> None:
        self.base = base
        self.assigned: dict[str, int] = {}

    def env(self, name: str) -> dict[str, str]:
        if self.base == 0:
            return {}
        port = self.base + len(self.assigned)
        if port > 65535:
            fail(f"metrics.port {self.base}: too few ports above it for {len(self.assigned) + 1} processes")
        self.assigned[name] = port
        return {"POWERFLEET_METRICS__PORT": str(port)}


def _wait_for_signal(stop: threading.Event, duration_s: float | None, launcher, on_tick=None) -> None:  # type: ignore[no-untyped-def]
    deadline = None if duration_s is None else time.monotonic() + duration_s
    while not stop.is_set():
        if deadline is not None and time.monotonic() >= deadline:
            return
        if launcher.redis is not None and not launcher.redis.running:
            typer.echo("powerfleet: embedded redis-server exited; stopping the fleet", err=True)
            return
        dead = launcher.dead_children()
        if dead:
            names = ", ".join(f"{c.name} (exit {c.proc.returncode}, log {c.log})" for c in dead)
            typer.echo(f"powerfleet: a fleet process stopped: {names}", err=True)
            return
        if on_tick is not None:
            on_tick()
        stop.wait(0.5)


def _install_stop_handlers(stop: threading.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


def up(
    ctx: typer.Context,
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="Where each process logs (default: a temp dir)."),
) -> None:
    """Embedded Redis (unless broker.url is set) + beat + a control/sweep worker + node agents + Flower.

    Runs in the foreground; Ctrl-C stops everything cleanly.
    """
    config = fleet_config(ctx)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="powerfleet-up-"))
    stop = threading.Event()
    _install_stop_handlers(stop)
    launcher, _ = _start_fleet(ctx, config, logs)
    typer.echo(f"fleet up: logs in {logs}; Flower on http://{config.flower.address}:{config.flower.port}; Ctrl-C stops",
               err=True)
    try:
        _wait_for_signal(stop, None, launcher)
    finally:
        typer.echo("stopping fleet...", err=True)
        launcher.stop()
    if not stop.is_set():
        raise typer.Exit(EXIT_FAILURE)


DEMO_ENV = {
    "POWERFLEET_NODES": "[twin-gpu-a, twin-gpu-b]",
    "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "3",
    "POWERFLEET_BEAT__BUDGET_INTERVAL_S": "5",
    "POWERFLEET_BEAT__RETUNE_INTERVAL_S": "2",
    "POWERFLEET_RETUNE__WINDOW_INTERVAL_S": "10",
    "POWERFLEET_RETUNE__DEPLOYMENTS": "[demo-llm]",
}


def demo(
    ctx: typer.Context,
    duration: float = typer.Option(40.0, "--duration", min=5.0, help="Seconds to run before stopping."),
    flower_port: int = typer.Option(0, "--flower-port", help="Flower port (0: a free one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tick summary as JSON at the end."),
) -> None:
    """The main job on embedded defaults: a private Redis and a small twin fleet, for a bounded time.

    Until the digital twin lands it shows the fleet's ticks running, then stops and exits 0
    when every tick family ran.
    """
    import os

    from powerfleet.broker.embedded import free_loopback_port

    env = dict(DEMO_ENV)
    env["POWERFLEET_FLOWER__PORT"] = str(flower_port or free_loopback_port())
    os.environ.update(env)
    os.environ.pop("POWERFLEET_BROKER__URL", None)  # the demo always uses its own private Redis
    config = fleet_config(ctx)
    logs = Path(tempfile.mkdtemp(prefix="powerfleet-demo-"))
    stop = threading.Event()
    _install_stop_handlers(stop)
    launcher, url = _start_fleet(ctx, config, logs)
    typer.echo(f"demo: nodes {', '.join(config.nodes)}; Flower http://127.0.0.1:{config.flower.port}; "
               f"logs {logs}; running {duration:g}s", err=True)
    import redis

    from powerfleet.beat.ticklog import TickLog
    from powerfleet.workers.app import TICK_FAMILIES

    ticklog = TickLog(redis.Redis.from_url(url))
    seen: dict[str, float] = {}
    counts = {f: 0 for f in TICK_FAMILIES}
    start = time.time()

    def show_new_ticks() -> None:
        details = ticklog.last_details()
        for family, at in ticklog.last_ticks().items():
            if seen.get(family) != at:
                seen[family] = at
                counts[family] = len(ticklog.origins(family))
                # With --json, stdout carries only the JSON document; progress goes to stderr.
                typer.echo(f"  t+{at - start:5.1f}s  {family:9s} tick #{counts[family]:<3d} {details.get(family, '')}",
                           err=as_json)

    try:
        _wait_for_signal(stop, duration, launcher, show_new_ticks)
        show_new_ticks()
    finally:
        launcher.stop()
    if as_json:
        from powerfleet.cli.errors import print_json

        print_json({"schema": "powerfleet.demo/v1", "duration_s": duration, "ticks": counts})
    missing = [f for f, n in counts.items() if n == 0]
    if missing and not stop.is_set():
        fail(f"demo: no {', '.join(missing)} tick ran; see the logs in {logs}", EXIT_FAILURE)
    typer.echo("demo finished: " + ", ".join(f"{f} x{n}" for f, n in counts.items()), err=True)
