"""`powerfleet retune ...` commands: sweep router settings over a recorded trace."""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from powerfleet.config.fleet import RetuneConfig

from powerfleet.cli import retune_status_cmd as retune_status
from powerfleet.cli.context import fleet_app, fleet_config
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json
from powerfleet.cli.sim_cmd import (
    EngineOpt,
    KvLinkOpt,
    PrefillProfileOpt,
    PrefillWorkersOpt,
    ProfileOpt,
    ReplayInputs,
    RouterOpt,
    SeedOpt,
    SlaOpt,
    StrictOpt,
    TraceOpt,
    WarmupOpt,
    WindowOpt,
    WorkersOpt,
    bad,
    check_counts,
    pools_opt,
)

app = typer.Typer(help="KV-router retune: sweeps and decisions.", no_args_is_help=True)
RESET_TASK = "powerfleet.retune.reset_window"
# The defaults of `retune sweep` are the live loop's (one sweep path: docs/retune.md).
_LIVE = RetuneConfig()


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
    trace: TraceOpt,
    workers: WorkersOpt,
    objective: str = typer.Option(..., "--objective", help="throughput, throughputPerGpu, throughputPerUser, ttft, e2eLatency, goodput or goodputPerGpu."),
    current: str = typer.Option(..., "--current", help="JSON object: the router settings in force now (any subset of the eight)."),
    grid: str = typer.Option("default", "--grid", help="Grid file (JSON or YAML) or 'default' (108 points)."),
    shards: int = typer.Option(_LIVE.max_shards, "--shards", help="At most this many shards."),
    min_improvement: float = typer.Option(_LIVE.min_improvement_percentage, "--min-improvement", help="Apply only when the best beats the probe by more than PCT % of |probe score| (default: the live default)."),
    window: WindowOpt = None,
    warmup_s: WarmupOpt = None,
    seed: SeedOpt = 0,
    sla: SlaOpt = None,
    processes: int | None = typer.Option(None, "--processes", help="Local worker processes (default: CPU count)."),
    profile: ProfileOpt = None,
    engine: EngineOpt = None,
    router: RouterOpt = None,
    prefill_workers: PrefillWorkersOpt = None,
    prefill_profile: PrefillProfileOpt = None,
    kv_transfer_gb_s: KvLinkOpt = _LIVE.kv_transfer_gb_s,
    search: bool = typer.Option(True, "--search/--no-search", help="Extend a knob beyond the grid's edge when the best sits on it."),
    search_rounds: int = typer.Option(_LIVE.search_rounds, "--search-rounds", min=0, max=50, help="At most this many rounds of the edge search (the live default)."),
    refine: bool = typer.Option(False, "--refine", help="After the edge search, also score midpoints around the best."),
    budget_s: float | None = typer.Option(_LIVE.time_budget_s, "--budget-s", help="Start no search round after this many wall seconds (default: the live time budget)."),
    min_requests: int = typer.Option(_LIVE.min_requests, "--min-requests", min=0, max=10_000_000, help="Keep unless the window holds this many requests (default: the live retune.min_requests)."),
    shift_z: float = typer.Option(_LIVE.shift_z, "--shift-z", min=0.0, max=1000.0, help="Score from a load change inside --window (Welch t at least this; 0: off; default: the live retune.shift_z)."),
    confidence: float = typer.Option(_LIVE.confidence, "--confidence", min=0.0, max=0.999999, help="Apply only when the paired batch test gives the best this one-sided confidence over the probe (0: off; default: the live retune.confidence)."),
    strict: StrictOpt = False,
    as_json: bool = typer.Option(False, "--json", help="Print the powerfleet.retune.sweep/v1 JSON result."),
) -> None:
    """Replay every grid point and a probe of the current settings; search beyond the grid's
    edge; score; decide."""
    from powerfleet.retune.grid import EdgeSearch, load_grid
    from powerfleet.retune.guard import NoiseGuard
    from powerfleet.retune.objectives import Objective, parse_objective
    from powerfleet.retune.sweep import run_sweep

    check_counts(shards=(shards, 1), processes=(processes, 1))
    cpus = os.cpu_count() or 1
    if processes is not None and processes > cpus:  # each one is a forked replay: never more than the machine
        bad(f"--processes must be at most {cpus} (this machine's CPUs), got {processes}")
    try:
        obj = parse_objective(objective)
    except ValueError as exc:
        bad(f"--objective: {exc}")
    if obj in (Objective.goodput, Objective.goodputPerGpu) and sla is None:
        bad(f"--objective {obj.value} needs --sla (ttft_ms and itl_ms, or e2e_ms)")
    if not (min_improvement >= 0 and min_improvement != float("inf")):
        bad(f"--min-improvement must be a finite number >= 0, got {min_improvement}")
    if budget_s is not None and not budget_s >= 0:
        bad(f"--budget-s must be >= 0, got {budget_s}")
    inp = ReplayInputs.load(trace=trace, workers=workers, seed=seed, policy=current, policy_opt="--current",
                            sla=sla, window=window, warmup_s=warmup_s, profile=profile, engine=engine,
                            router=router, strict=strict)
    pools = pools_opt(workers, prefill_workers, prefill_profile, kv_transfer_gb_s, inp.profile)
    try:
        g = load_grid(grid)
        g.points(inp.policy)
    except ValueError as exc:
        bad(f"--grid: {exc}")
    from powerfleet.sim.trace import select_window

    if inp.window is not None and not select_window(list(inp.requests), *inp.window):
        bad(f"--window: no request of the trace lies in {window}; nothing to sweep")
    win, warm_s, shift = _scored(inp.requests, inp.window, inp.warmup_s, shift_z, min_requests)
    prog, update = _progress_bar()
    try:
        result = run_sweep(
            inp.requests, pools, obj, inp.policy, g, max_shards=shards, min_improvement_pct=min_improvement,
            window=win, seed=seed, sla=inp.sla, processes=processes or min(os.cpu_count() or 1, shards + 1),
            profile=inp.profile, engine=inp.engine, progress=update, warmup_s=warm_s, router=inp.router,
            search=EdgeSearch(enabled=search and search_rounds > 0, max_rounds=search_rounds, refine=refine),
            budget_s=budget_s,
            guard=NoiseGuard(min_requests=min_requests, confidence=confidence, dwell_windows=0),
        )
    except ValueError as exc:
        bad(str(exc))
    finally:
        if prog is not None:
            prog.stop()
    if shift is not None:
        result = result.model_copy(update={"scored_from_s": win[0] if win else None, "shift": str(shift)})
    if as_json:
        print_json(result.to_json_dict())
        return
    d = result.decision
    if shift is not None:
        sys.stdout.write(f"scored from {result.scored_from_s:g} s, the load change found in the window: {shift}\n")
    ok = sum(1 for c in result.candidates if c.ok)
    sys.stdout.write(
        f"{result.grid_points} grid points in {result.shards} shards + {result.search_points} beyond its edge "
        f"({ok} scored), objective {result.objective} ({result.direction}, {result.units})\n"
    )
    if result.held_knobs:  # grid knobs that cannot change this replay (retune/effect.py)
        sys.stdout.write(f"held at the current value (no effect on this replay): {', '.join(result.held_knobs)}\n")
    sys.stdout.write(f"probe  {_p(result.probe.params)}  score {result.probe.score}\n")
    for c in d.ranked[:5]:
        sys.stdout.write(f"  {_p(c.params)}  score {c.score:.6g}  ({c.origin})\n")
    sys.stdout.write(f"decision: {d.action} {_p(d.params)}\n{d.reason}\n")


def _scored(requests: Any, window: tuple[float | None, float | None] | None, warmup_s: float | None,
            shift_z: float, min_requests: int) -> tuple[Any, float | None, Any]:
    """The live window step's scoring span: from a load change inside a closed ``--window``
    (``retune.shift.scored_window``), the warm-up reaching as far back as without it."""
    from powerfleet.retune.shift import ShiftRule, scored_window
    from powerfleet.sim.replay import warmup_span

    if window is None or window[0] is None or window[1] is None or shift_z <= 0 or not requests:
        return window, warmup_s, None
    t0 = min(r.timestamp_ms for r in requests)
    ts = [(r.timestamp_ms - t0) / 1000.0 for r in requests]
    win = (window[0], window[1])
    new, warm, found = scored_window(ts, [r.input_length for r in requests], win, warmup_span(win, warmup_s),
                                     ShiftRule(z=shift_z, min_ratio=_LIVE.shift_min_ratio), min_requests)
    return (new, warm if found is not None else warmup_s, found)


def _p(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={params[k]:g}" for k in ("overlap_score_credit", "prefill_load_scale", "temperature"))

app.command("status")(retune_status.status)


@app.command("reset-window")
def reset_window_cmd(
    ctx: typer.Context,
    dgd: str = typer.Option(..., "--dgd", help="The deployment whose window record to reset."),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, max=3600, help="Seconds to wait for the result."),
    as_json: bool = typer.Option(False, "--json", help="Print the task's JSON result."),
) -> None:
    """Reset a deployment's window record to the newest window really decided that has closed
    (runs powerfleet.retune.reset_window on a control worker, as the leader)."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    from powerfleet.retune.cut import CutError, safe_name
    from powerfleet.workers.app import SEND_ERRORS

    try:
        safe_name(dgd, "--dgd")
    except CutError:
        bad(f"--dgd: {dgd!r} is not a Kubernetes object name")
    app_ = fleet_app(fleet_config(ctx))
    kwargs = {"dgd": dgd}
    try:
        app_.check_send(RESET_TASK, None, kwargs, task_api=True)
    except SEND_ERRORS as exc:
        bad(str(exc))
    result = app_.send_task(RESET_TASK, kwargs=kwargs)
    try:
        value = result.get(timeout=timeout, propagate=False)
    except CeleryTimeout:
        fail(f"{RESET_TASK}: no result within {timeout:g}s; is a control worker running?", EXIT_FAILURE)
    if result.state != "SUCCESS":
        fail(f"{RESET_TASK} {result.state}: {value}", EXIT_FAILURE)
    if as_json:
        print_json(value)
        return
    if value.get("status") in ("reset", "unchanged"):
        sys.stdout.write(f"{dgd}: window record {value['status']}: last decided window {value['last_window']} "
                         f"(was {value['was']}; newest closed {value['newest_closed']})\n")
        return
    fail(f"{dgd}: {value.get('status')}: {value.get('reason') or value.get('error')}", EXIT_FAILURE)
