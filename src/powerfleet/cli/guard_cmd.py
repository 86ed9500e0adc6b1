"""`powerfleet power guard`: the live power guard as its own process, on its own deadlines.

With ``power.guard_runner: process`` beat has no guard entries and this process keeps every
oversubscribed group's period (power/loop.py: fixed deadlines, slips counted), running the same
period as the beat-driven task (tasks/power.py ``run_guard``: the group's lock, its memory, the
record the agents apply, the overlays). `up`, the demo and the chart start it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Optional

import typer

from powerfleet.cli.context import fleet_app, fleet_config
from powerfleet.cli.errors import fail, print_json
from powerfleet.cli.processes import LOGLEVEL_HELP, METRICS_PORT_HELP, _metrics_port, check_loglevel

log = logging.getLogger("powerfleet.power")


def runs_guard_process(config: Any) -> bool:
    """Whether `up` and the demo start `powerfleet power guard` (and beat runs no guard entries)."""
    return config.power.guard_runner == "process" and bool(config.budget.oversubscribed())


GUARD_ARGV = ("power", "guard")


def guard(
    ctx: typer.Context,
    group: Optional[list[str]] = typer.Option(None, "--group", metavar="GROUP", help="An oversubscribed group to guard "
                                              "(repeatable; default: every one in budget.groups)."),
    once: bool = typer.Option(False, "--once", help="Run one period for each group, print what it did, exit."),
    as_json: bool = typer.Option(False, "--json", help="With --once: print the periods' results as JSON."),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l", help=LOGLEVEL_HELP, callback=check_loglevel),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help=METRICS_PORT_HELP),
) -> None:
    """Run the live power guard as its own process: each oversubscribed group's period on fixed
    deadlines (power.guard_runner: process; docs/power.md)."""
    config = fleet_config(ctx)
    limits = config.budget.oversubscribed()
    groups = list(dict.fromkeys(group)) if group else sorted(limits)
    unknown = [g for g in groups if g not in limits]
    if unknown:
        fail(f"--group: {unknown[0]!r} is not an oversubscribed group (budget.groups.<g>.oversubscription > 1.0)")
    if not groups:
        fail("no oversubscribed group to guard (budget.groups.<g>.oversubscription > 1.0)")
    if not once and config.power.guard_runner != "process":
        fail("power.guard_runner is 'beat': beat's entries run the guard, and a second runner would run each "
             "period twice; set power.guard_runner: process to run it here (or use --once)")
    if as_json and not once:
        fail("--json: only with --once (the running guard logs; its figures are on /metrics)")
    port = 0 if once else _metrics_port(config, metrics_port)
    logging.basicConfig(level=loglevel, format="[%(asctime)s: %(levelname)s/guard] %(message)s")
    app = fleet_app(config)  # with the tasks: its sends are checked against their argument models
    periods = GuardPeriods(app, {g: limits[g] for g in groups})
    if once:
        results = [r.model_dump(mode="json") for r in periods.run_all()]
        if as_json:
            print_json(results)
        else:
            for r in results:
                typer.echo(f"{r['group']}: {'ran' if r['ran'] else 'not run (another run held the lock)'}, "
                           f"mode {r['mode']}, measured {r['measured_w']} W of {r['limit_w']} W, "
                           f"overlays to {len(r['overlays'])} node(s)" + (f"; refused: {r['refused']}" if r['refused'] else ""))
        return
    from powerfleet.metrics.registry import serve_metrics

    serve_metrics(port, config.metrics.address)
    _run_until_stopped(periods, config.power.guard_period_s)


class GuardPeriods:
    """One period of every group, each group's failure kept to itself (one line per change)."""

    def __init__(self, app: Any, limits: dict[str, float]) -> None:
        from powerfleet.power.telemetry import RedisTelemetry
        from powerfleet.tasks.ports import fleet_redis

        self.app, self.limits = app, limits
        self.r = fleet_redis(app)
        self.telemetry = RedisTelemetry(self.r)
        self._failing: dict[str, str] = {}

    def run_all(self) -> list[Any]:
        from powerfleet.broker.outage import first_line
        from powerfleet.tasks.ports import clock
        from powerfleet.tasks.power import guard_topology, run_guard

        done = []
        for group, limit in self.limits.items():
            try:
                # Built in the period, not at start: without cluster access yet (no kubeconfig, the API
                # server not up) the process says so in one line and tries again each period.
                topology = guard_topology(self.app)
                done.append(run_guard(self.app, group, limit, topology, self.telemetry, self.r, clock.now()))
            except Exception as exc:  # noqa: BLE001 - a group's failure (Redis, the API server) is its own
                why = first_line(exc)
                if self._failing.get(group) != why:
                    log.warning("guard %s: a period failed (%s); its agents keep the last overlay until it expires, "
                                "then take their safe caps", group, why, exc_info=log.isEnabledFor(logging.DEBUG))
                self._failing[group] = why
                continue
            if self._failing.pop(group, None) is not None:
                log.info("guard %s: periods run again", group)
        return done


def _run_until_stopped(periods: GuardPeriods, period_s: float) -> None:
    from powerfleet.power import metrics as power_metrics
    from powerfleet.power.loop import run_periods

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def slipped(missed: int, lateness_s: float) -> None:
        if missed:
            power_metrics.GUARD_SLIPS.labels(why="missed").inc(missed)
        else:
            power_metrics.GUARD_SLIPS.labels(why="late").inc()
        log.warning("guard: a period started %.2f s after its deadline%s", lateness_s,
                    f" and ran past {missed} more" if missed else "")

    log.info("guard: %s, a period every %g s on its own deadlines", ", ".join(periods.limits), period_s)
    stats = run_periods(period_s, periods.run_all, time.monotonic, stop.wait, slipped)
    log.info("guard: stopped after %d periods (%d missed, %d late; latest start %.2f s after its deadline)",
             stats.periods, stats.missed, stats.late, stats.max_lateness_s)
