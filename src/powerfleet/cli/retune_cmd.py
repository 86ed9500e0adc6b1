"""`powerfleet retune ...` commands: sweep router settings over a recorded trace."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from powerfleet.cli.errors import print_json
from powerfleet.cli.sim_cmd import (
    ENGINE_HELP,
    bad,
    check_counts,
    load_profile_opt,
    load_requests,
    parse_common,
    parse_engine_opt,
)

app = typer.Typer(help="KV-router retune: sweeps and decisions.", no_args_is_help=True)


def _progress_bar() -> tuple[Any, Any]:
    """A rich progress bar on stderr, started lazily (after the pool has forked)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    prog = Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "task" not in state:
            prog.start()
            state["task"] = prog.add_task("replaying", total=total)
        prog.update(state["task"], completed=done)

    return prog, update


@app.command("sweep")
def sweep_cmd(
    trace: Path = typer.Option(..., "--trace", help="Mooncake JSON-lines trace, plain or gzip."),
    workers: int = typer.Option(..., "--workers", help="Number of worker replicas."),
    objective: str = typer.Option(..., "--objective", help="throughput, throughputPerGpu, throughputPerUser, ttft, e2eLatency, goodput or goodputPerGpu."),
    current: str = typer.Option(..., "--current", help="JSON object: the router settings in force now (any subset of the eight)."),
    grid: str = typer.Option("default", "--grid", help="Grid file (JSON or YAML) or 'default' (108 points)."),
    shards: int = typer.Option(3, "--shards", help="At most this many shards."),
    min_improvement: float = typer.Option(0.0, "--min-improvement", help="Apply only when the best beats the probe by more than PCT % of |probe score|."),
    window: str | None = typer.Option(None, "--window", help="START_S:END_S slice of the trace, in seconds from its start."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random streams (shared by every candidate)."),
    sla: str | None = typer.Option(None, "--sla", help='Goodput SLA, e.g. {"ttft_ms": 2000, "itl_ms": 50}.'),
    processes: int | None = typer.Option(None, "--processes", help="Local worker processes (default: CPU count)."),
    profile: Path | None = typer.Option(None, "--profile", help="Timing profile JSON (tables); default: built-in."),
    engine: str | None = typer.Option(None, "--engine", help=ENGINE_HELP),
    strict: bool = typer.Option(False, "--strict", help="A malformed line or corrupt gzip member is fatal."),
    as_json: bool = typer.Option(False, "--json", help="Print the powerfleet.retune.sweep/v1 JSON result."),
) -> None:
    """Replay every grid point and a probe of the current settings; score; decide."""
    from powerfleet.retune.grid import load_grid
    from powerfleet.retune.objectives import parse_objective
    from powerfleet.retune.sweep import run_sweep

    check_counts(workers=(workers, 1), seed=(seed, 0), shards=(shards, 1), processes=(processes, 1))
    try:
        obj = parse_objective(objective)
    except ValueError as exc:
        bad(str(exc))
    cur, sl, win = parse_common(current, sla, window)
    if not (min_improvement >= 0 and min_improvement != float("inf")):
        bad(f"--min-improvement must be a finite number >= 0, got {min_improvement}")
    try:
        g = load_grid(grid)
        g.points(cur)
    except ValueError as exc:
        bad(str(exc))
    prof = load_profile_opt(profile)
    eng = parse_engine_opt(engine)
    reqs = load_requests(trace, strict)
    prog, update = _progress_bar()
    try:
        result = run_sweep(
            reqs, workers, obj, cur, g, max_shards=shards, min_improvement_pct=min_improvement,
            window=win, seed=seed, sla=sl, processes=processes or min(os.cpu_count() or 1, shards + 1),
            profile=prof, engine=eng, progress=update,
        )
    except ValueError as exc:
        bad(str(exc))
    finally:
        if prog is not None:
            prog.stop()
    if as_json:
        print_json(result.to_json_dict())
        return
    d = result.decision
    ok = sum(1 for c in result.candidates if c.ok)
    sys.stdout.write(
        f"{result.grid_points} candidates in {result.shards} shards ({ok} scored), objective "
        f"{result.objective} ({result.direction}, {result.units})\n"
    )
    sys.stdout.write(f"probe  {_p(result.probe.params)}  score {result.probe.score}\n")
    for c in d.ranked[:5]:
        sys.stdout.write(f"  {_p(c.params)}  score {c.score:.6g}\n")
    sys.stdout.write(f"decision: {d.action} {_p(d.params)}\n{d.reason}\n")


def _p(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={params[k]:g}" for k in ("overlap_score_credit", "prefill_load_scale", "temperature"))
from powerfleet.cli import retune_status_cmd  # noqa: E402,F401  registers `retune status`
