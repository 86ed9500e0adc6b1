"""`powerfleet twin`: the digital twin alone, in the foreground, for pointing other commands at it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

from powerfleet.cli import control_plane_opt
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json
from powerfleet.twin.cluster.topology import MAX_NODES, MIN_NODES


def fleet_settings(tw: Any, window_s: int, scenario: Any = None) -> dict[str, str]:
    """The variables that point a fleet (`powerfleet up` on this machine) at the twin.

    The same settings the demo gives its fleet (budgets, the twin's retune window, short beat
    intervals), with one proc root and one state directory for every agent of the machine.
    """
    from powerfleet.cli.demo_cmd import config_env, twin_fleet_env

    env = twin_fleet_env(tw, window_s, scenario)
    env.update(config_env({"agent.proc_root": str(tw.root / "proc" / "all"),
                     "agent.state_dir": str(tw.root / "agent-state")}))
    return env


def export_lines(settings: dict[str, str]) -> list[str]:
    """``export KEY=VALUE`` lines a POSIX shell accepts as they are (values quoted)."""
    return [f"export {key}={shlex.quote(value)}" for key, value in settings.items()]


class DirLock:
    """An exclusive lock on a twin's ``--dir``: a second twin there would overwrite the first's files."""

    def __init__(self, root: Path) -> None:
        self.path = root / ".twin.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise TwinDirBusy(f"{self.path.parent} is in use by another twin (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays, harmless
            self._fd = None


class TwinDirBusy(Exception):
    pass


def _run(tw: Any, plan: Any, stop: threading.Event, duration: float) -> None:
    """Until Ctrl-C or ``duration``; with a scenario, its traffic multipliers over its duration."""
    if plan is None:
        stop.wait(duration if duration > 0 else None)
        return
    from powerfleet.twin.demo.scenario_twin import multiplier_at

    started = time.monotonic()
    while not stop.is_set() and (duration <= 0 or time.monotonic() - started < duration):
        t = time.monotonic() - started
        for dgd, source in tw.sources.items():
            source.rate = multiplier_at(plan, dgd, t)
        stop.wait(1.0)


def twin(
    nodes: int = typer.Option(4, "--nodes", min=MIN_NODES, max=MAX_NODES, help="GPU nodes (8 GPUs each)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed for traffic thinning, telemetry noise and GPU ids."),
    directory: Optional[Path] = typer.Option(None, "--dir", help="Where the twin keeps its files (default: a temp dir)."),
    window: int = typer.Option(20, "--window", min=10, max=3600, help="Retune window (s) the frontends account by."),
    traces: Optional[Path] = typer.Option(None, "--traces", help="Directory with the Mooncake traces."),
    duration: float = typer.Option(0.0, "--duration", min=0.0, help="Stop after this many seconds (0: until Ctrl-C)."),
    as_json: bool = typer.Option(False, "--json", help="Print the twin's paths and URLs as JSON (twin.json)."),
    scenario: Optional[str] = typer.Option(None, "--scenario",
                                           help="A shipped scenario or a scenario file (docs/twin.md): its "
                                                "topology, deployments, tenants and traffic; its events need a "
                                                "fleet and are run by `powerfleet demo --scenario`."),
    control_plane: str = control_plane_opt.option(),
) -> None:
    """Run the twin: a loopback Kubernetes API with GPU nodes, two DGDs, their pods, GPUs, frontends and traffic.

    Prints the kubeconfig path and the frontends' URLs; point `powerfleet up` at it with the
    printed POWERFLEET_* settings (or --kubeconfig where a command takes one). Ctrl-C stops it.
    """
    from powerfleet.twin.runtime import Twin, TwinOptions
    from powerfleet.twin.cluster.topology import TwinSpec

    if traces is not None and not traces.is_dir():
        fail(f"--traces: {traces} is not a directory")
    server_for = control_plane_opt.resolve(control_plane)
    options = TwinOptions(spec=TwinSpec(nodes=nodes, seed=seed), window_s=window, traces=traces)
    plan = None
    if scenario is not None:
        from powerfleet.cli.demo_cmd import load_scenario, scenario_options

        plan, path = load_scenario(scenario, None, None)
        options = scenario_options(options, plan, path, seed)
    root = directory or Path(tempfile.mkdtemp(prefix="powerfleet-twin-"))
    lock = DirLock(root)
    try:
        lock.acquire()
    except TwinDirBusy as exc:
        fail(f"twin: --dir {exc}", EXIT_FAILURE)
    except OSError as exc:
        fail(f"twin: cannot start in {root}: {exc.strerror or exc}", EXIT_FAILURE)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    tw = Twin(replace(options, root=root), server=server_for(root))
    try:
        tw.start()
    except OSError as exc:
        tw.stop()
        fail(f"twin: cannot start in {root}: {exc.strerror or exc}", EXIT_FAILURE)
    try:
        # Frontends start once their pods run: wait for them before printing their URLs.
        waited = 0.0
        while len(tw.frontends) < len(tw.sources) and waited < 30 and not stop.is_set():
            stop.wait(0.5)
            waited += 0.5
        manifest = tw.manifest()
        tw.write_manifest()
        if as_json:
            print_json(manifest)
        else:
            typer.echo(f"twin: {tw.spec.nodes} nodes, {tw.spec.total_gpus} GPUs in {tw.root}")
            typer.echo(f"kubeconfig: {tw.kubeconfig}")
            typer.echo(f"API server: {tw.api.url}")
            for name, fe in manifest["frontends"].items():
                typer.echo(f"frontend {name}: router {fe['router_url']}/router_policy, metrics {fe['metrics_url']}")
            typer.echo("point a fleet at it: paste these lines into a shell, then run `powerfleet up` there:")
            for line in export_lines(fleet_settings(tw, window, plan)):
                typer.echo(line)
            typer.echo(f"paths and URLs: {tw.root / 'twin.json'}")
            typer.echo("Ctrl-C stops the twin", err=True)
        if plan is not None and plan.events:
            typer.echo(f"twin: the scenario's {len(plan.events)} events are not run here (they act on a fleet: "
                       "`powerfleet demo --scenario` runs them); its traffic multipliers are", err=True)
        _run(tw, plan, stop, duration)
    finally:
        tw.stop()
        lock.release()
    if not as_json:
        typer.echo(json.dumps({"samples": len(tw.samples), "tick_errors": tw.tick_errors}), err=True)
