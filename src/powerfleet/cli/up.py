"""`powerfleet up`: the whole fleet in the foreground (`powerfleet demo` is in demo_cmd)."""

from __future__ import annotations

import shlex
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import typer

from powerfleet.cli.context import check_broker_reachable, export_config_path, fleet_config, redact
from powerfleet.cli.errors import EXIT_FAILURE, fail
from powerfleet.config import FleetConfig


def _start_fleet(ctx: typer.Context, config: FleetConfig, log_dir: Path):  # type: ignore[no-untyped-def]
    from powerfleet.broker.embedded import BrokerUnavailable
    from powerfleet.cli.up_children import die_with_parent
    from powerfleet.workers.launcher import Launcher

    export_config_path(ctx)
    prepare_log_dir(log_dir, "--log-dir")  # before Redis starts: a bad directory leaves nothing running
    metrics = MetricsPorts(config.metrics.port)
    from powerfleet.cli.guard_cmd import GUARD_ARGV, runs_guard_process

    guard = runs_guard_process(config)  # power.guard_runner: process
    names = ["worker", *(f"agent-{node}" for node in config.nodes), "beat", *(["guard"] if guard else [])]
    ports = {name: metrics.env(name) for name in names}  # checked before anything starts, too
    launcher = Launcher(log_dir=log_dir, preexec=die_with_parent())
    if config.broker.url is None:
        try:
            url = launcher.start_embedded_broker()
        except BrokerUnavailable as exc:
            fail(str(exc))
        where = f"embedded redis-server at {url}"
    else:
        url = config.broker.url
        # Before anything starts: an unreachable broker, or one that is not Redis, is one line
        # here rather than every process failing on it in its own log.
        check_broker_reachable(url, broker=config.broker)
        where = f"broker {redact(url)}"
    # Other commands (status, trigger) need it; a password is never printed (it is in the config).
    paste = f"export POWERFLEET_BROKER__URL={shlex.quote(url)}" if redact(url) == url else "as configured"
    typer.echo(f"{where} (for status/trigger: {paste})", err=True)
    try:
        launcher.spawn("worker", "worker", "--queues", "control,sweep", "--name", "fleet@up", env=ports["worker"])
        for node in config.nodes:
            launcher.spawn(f"agent-{node}", "agent", "--node", node, env=ports[f"agent-{node}"])
        launcher.spawn("beat", "beat", env=ports["beat"])
        if guard:
            launcher.spawn("guard", *GUARD_ARGV, env=ports["guard"])
        launcher.spawn("flower", "flower")
    except BaseException:
        launcher.stop()  # never leave the embedded redis-server or a started child behind
        raise
    if metrics.assigned:
        typer.echo("metrics: " + ", ".join(f"{name} http://{config.metrics.address}:{port}/metrics"
                                           for name, port in metrics.assigned.items()), err=True)
    return launcher, url


def prepare_log_dir(path: Path, option: str) -> None:
    """Create ``path`` and prove it writable, or exit 2 naming ``option`` (shared with `demo --report`)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".powerfleet-probe-"):
            pass
    except OSError as exc:
        fail(f"{option}: cannot write to {path} ({exc.strerror or exc})")


def stopped_reason(child) -> str:  # type: ignore[no-untyped-def]
    """Why a fleet process stopped: its exit code and the last line it logged."""
    last = ""
    try:
        with open(child.log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
            last = lines[-1].strip()[:300] if lines else ""
    except OSError:
        pass
    said = f": {last}" if last else ""
    return f"{child.name} (exit {child.proc.returncode}{said}; log {child.log})"


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


class Restarts:
    """When `up` restarts a fleet process that stopped (issue 31 item 6: a broker failover must not
    stop the fleet): at most ``limit`` times per ``window_s`` per process, and never one that exited
    2 (a refusal, such as a port in use or a bad setting, that a restart cannot fix)."""

    def __init__(self, limit: int = 3, window_s: float = 60.0, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self.times: dict[str, list[float]] = {}

    def refuse(self, name: str, code: int | None) -> str | None:
        """None: restart it (and count it); else why not, in a few words."""
        if code == 2:
            return "it refused to run (exit 2)"
        now = self.clock()
        recent = [t for t in self.times.get(name, []) if now - t < self.window_s]
        if len(recent) >= self.limit:
            return f"restarted {len(recent)} times in {self.window_s:g} s already"
        self.times[name] = [*recent, now]
        return None


def _wait_for_signal(stop: threading.Event, duration_s: float | None, launcher, on_tick=None,  # type: ignore[no-untyped-def]
                     restarts: Restarts | None = None) -> None:
    deadline = None if duration_s is None else time.monotonic() + duration_s
    while not stop.is_set():
        if deadline is not None and time.monotonic() >= deadline:
            return
        if launcher.redis is not None and not launcher.redis.running:
            typer.echo("powerfleet: embedded redis-server exited; stopping the fleet", err=True)
            return
        dead = launcher.dead_children()
        if dead and restarts is None:
            names = ", ".join(stopped_reason(c) for c in dead)
            typer.echo(f"powerfleet: a fleet process stopped: {names}", err=True)
            return
        for child in dead:
            why = restarts.refuse(child.name, child.proc.returncode)  # type: ignore[union-attr]
            if why is not None:
                typer.echo(f"powerfleet: a fleet process stopped: {stopped_reason(child)}; {why}: stopping the fleet",
                           err=True)
                return
            typer.echo(f"powerfleet: a fleet process stopped: {stopped_reason(child)}; restarting it", err=True)
            launcher.respawn(child)
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

    Runs in the foreground; Ctrl-C stops everything cleanly. A process that stops is restarted (and
    said so on stderr), at most 3 times a minute; one that refuses to run (exit 2) stops the fleet.
    """
    config = fleet_config(ctx)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="powerfleet-up-"))
    stop = threading.Event()
    _install_stop_handlers(stop)
    launcher, _ = _start_fleet(ctx, config, logs)
    typer.echo(f"fleet up: logs in {logs}; Flower on http://{config.flower.address}:{config.flower.port}; Ctrl-C stops",
               err=True)
    try:
        _wait_for_signal(stop, None, launcher, restarts=Restarts())
    finally:
        typer.echo("stopping fleet...", err=True)
        launcher.stop()
    if not stop.is_set():
        raise typer.Exit(EXIT_FAILURE)
