"""`powerfleet power ...`: what oversubscribing a group would do, on replayed traffic (docs/power.md)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from powerfleet.cli.errors import fail, print_json
from powerfleet.cli.guard_cmd import guard
from powerfleet.cli.sim_cmd import SeedOpt, TraceOpt, WindowOpt, load_requests

app = typer.Typer(help="Measured-power oversubscription: the live guard's process, and the guard on replayed traffic.",
                  no_args_is_help=True)
app.command("guard")(guard)

GUARD_HELP = ("JSON guard settings: t1, t2, release, target (fractions of the limit), decrease, step_w, "
              "period_s (whole seconds here), stale_periods, cap_ceiling; the sensor check's floor_w, stuck_s, "
              "stuck_load_w; unseen_w.")


@app.command("whatif")
def whatif_cmd(
    trace: TraceOpt,
    workers: int = typer.Option(..., "--workers", help="Worker replicas in the group (1 to 4096)."),
    gpus_per_worker: int = typer.Option(..., "--gpus-per-worker", help="GPUs per worker (tensor parallel)."),
    cap_w: float = typer.Option(..., "--cap-w", help="Cap each GPU's pod requests, W."),
    limit_w: float = typer.Option(..., "--limit-w", help="The group's power limit, W."),
    window: WindowOpt = None,
    load_scale: float = typer.Option(1.0, "--load-scale", help="Arrival rate x S (inter-arrival times / S)."),
    priority_split: float = typer.Option(0.5, "--priority-split",
                                         help="Share of the workers and of the traffic at low priority (0 to 1)."),
    sla: str | None = typer.Option(None, "--sla", help="Goodput SLA: ttft_ms=...,itl_ms=... or e2e_ms=... "
                                                       "(default: every completed request counts)."),
    telemetry_loss: str | None = typer.Option(None, "--telemetry-loss",
                                              help="A:B simulated seconds with no telemetry and no overlay "
                                                   "(guard, beat or Redis down): agents fall back to safe caps."),
    fault: list[str] | None = typer.Option(None, "--fault", help=(
        "KIND:GPUS:START:END, repeatable: unreadable, zero or stuck readings, or agent-dead / agent-restart, "
        "on GPUs like 0-3,6 over simulated seconds [START, END) (docs/power.md).")),
    actuation_s: float = typer.Option(0.5, "--actuation-s", help="From a guard tick to the new caps binding, s."),
    guard: str | None = typer.Option(None, "--guard", help=GUARD_HELP),
    seed: SeedOpt = 0,
    as_json: bool = typer.Option(False, "--json", help="Print the powerfleet.power.whatif/v1 JSON."),
) -> None:
    """Replay the traffic on N workers of one group under the guard and report goodput, latency,
    the group's measured draw, excursions over the limit, capping and the fallback."""
    from pydantic import ValidationError

    from powerfleet.power.faults import parse_fault
    from powerfleet.power.guard import GuardSettings
    from powerfleet.power.inputs import parse_span, parse_sla_pairs
    from powerfleet.power.report import report
    from powerfleet.power.whatif import WhatIfConfig, run_whatif
    from powerfleet.sim.policy import first_error, load_json_object
    from powerfleet.sim.replay import parse_window, prepare

    try:
        sl = parse_sla_pairs(sla)
        loss = parse_span(telemetry_loss, "--telemetry-loss")
        faults = tuple(parse_fault(f) for f in fault or ())
        win = parse_window(window)
        settings = GuardSettings.model_validate(load_json_object(guard, "--guard")) if guard else GuardSettings()
    except ValidationError as exc:
        fail(f"--guard {first_error(exc)}")
    except ValueError as exc:
        fail(str(exc))
    try:
        cfg = WhatIfConfig(workers=workers, gpus_per_worker=gpus_per_worker, cap_w=cap_w, limit_w=limit_w,
                           load_scale=load_scale, priority_split=priority_split, sla=sl, telemetry_loss=loss,
                           actuation_s=actuation_s, guard=settings, seed=seed, faults=faults)
    except ValidationError as exc:
        loc, msg = _option(exc)
        fail(f"{loc}: {msg}")
    requests = load_requests(trace, strict=False)
    try:
        arr = prepare(requests, seed=seed, speedup=load_scale, window=win, warmup_s=0.0)
        if not arr.arrival_ms:
            fail(f"no request of the trace falls in the window {window!r}")
        rep = report(run_whatif(arr, cfg))
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        print_json(rep.to_json_dict())
        return
    _print(rep)


def _option(exc: Any) -> tuple[str, str]:
    """The CLI option a config field came from, and pydantic's message."""
    from powerfleet.sim.policy import error_location

    loc, msg = error_location(exc, default="")
    field = loc.split(".")[0]
    msg = msg.removeprefix("Value error, ")
    return ("--" + field.replace("_", "-") if field else "input"), msg


def _pct(p: Any, unit: str) -> str:
    return "n/a" if p.p50 is None else f"p50 {p.p50:.1f} p99 {p.p99:.1f} {unit}"


def _print(r: Any) -> None:
    out = sys.stdout
    out.write(f"group: {r.workers} workers, {r.gpus} GPUs; requested {r.requested_w:.0f} W under a limit of "
              f"{r.limit_w:.0f} W ({r.oversubscription:.2f}x; cap-sum budgeting admits {r.cap_sum_gpus} GPUs)\n")
    sla = "completed" if r.sla is None else "meeting the SLA"
    out.write(f"requests {r.requests} completed {r.completed}; goodput {r.goodput_rps:.3f} req/s ({sla}); "
              f"simulated {r.duration_s:.0f} s at load x{r.load_scale:g}\n")
    out.write(f"TTFT {_pct(r.ttft_ms, 'ms')}  ITL {_pct(r.itl_ms, 'ms')}\n")
    for prio, c in r.by_priority.items():
        capped = "n/a" if c.capped_gpu_time_fraction is None else f"{100 * c.capped_gpu_time_fraction:.1f} %"
        out.write(f"  {prio:<4} {c.workers} workers  goodput {c.goodput_rps:.3f} req/s  TTFT {_pct(c.ttft_ms, 'ms')}  "
                  f"ITL {_pct(c.itl_ms, 'ms')}  capped {capped}  caps lowered {c.throttle_events}\n")
    d = r.draw_w
    out.write(f"measured draw (1 s): mean {d.mean} W  p99 {d.p99} W  max {d.max} W\n")
    e = r.excursions
    out.write(f"excursions over the limit: {e.count}, longest {e.longest_s} s, largest overshoot {e.max_over_w} W\n")
    out.write(f"capped below request: {100 * r.capped.gpu_time_fraction:.1f} % of GPU time, "
              f"{r.capped.events_per_gpu_hour} capping events per GPU-hour\n")
    if r.faults:
        out.write(f"faults: {'; '.join(r.faults)}\n")
    f = r.fallback
    out.write(f"fallback: {f.activations} node activations, longest reaction "
              f"{'n/a' if f.longest_reaction_s is None else f'{f.longest_reaction_s} s'}\n")
    g = r.guard
    out.write(("guard: " if g["active"] else "guard: off (the requested caps fit the limit); settings ")
              + f"t1 {g['t1']} t2 {g['t2']} release {g['release']} target {g['target']} decrease {g['decrease']} "
              f"step {g['step_w']} W period {g['period_s']} s actuation {g['actuation_s']} s; periods by mode "
              f"{g['modes']}\n")
