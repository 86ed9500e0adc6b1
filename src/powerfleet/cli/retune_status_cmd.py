"""`powerfleet retune status [--json]`: per deployment, the leader, mode, last decisions and
router convergence (read-only; the powerfleet.retune.status/v1 JSON is in docs/json-contracts.md).

``cli/retune_cmd.py`` registers it on the ``retune`` group; this module imports nothing above it."""

from __future__ import annotations

import re
import sys
from typing import Any

import typer

from powerfleet.cli.context import fleet_config
from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json
from powerfleet.clock import SystemClock


def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the powerfleet.retune.status/v1 JSON."),
) -> None:
    """Show each retune deployment's leader, mode, last decisions and router convergence."""
    from powerfleet.cluster.leases import connect
    from powerfleet.cluster.router import RouterClient
    from powerfleet.retune.status import fleet_status

    cfg = fleet_config(ctx).retune
    try:
        cluster = connect(cfg.kubeconfig)
    except Exception as exc:  # kubeconfig unreadable or no service account: one line, no traceback
        fail(f"cannot reach the cluster ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
             EXIT_FAILURE)
    try:
        with RouterClient() as router:
            data = fleet_status(cfg, cluster, router, SystemClock())
    finally:
        cluster.close()
    unreachable = [d for d in data["deployments"] if d.get("cluster_error")]
    if as_json:
        print_json(data)
    else:
        if not data["deployments"]:
            sys.stdout.write("no deployment has retune configured (retune.deployments)\n")
        for d in data["deployments"]:
            sys.stdout.write(_text(d, cfg))
    if unreachable and len(unreachable) == len(data["deployments"]):
        fail(f"cannot reach the cluster: {unreachable[0]['error']}", EXIT_FAILURE)


def _text(d: dict[str, Any], cfg: Any = None) -> str:
    if "error" in d:
        return f"{d['deployment']}: error: {d['error']}\n"
    if d.get("dgd") == "not found":
        # Configured but absent: nothing is enabled or led; say so first, not "enabled".
        return f"{d['deployment']}: not found (in retune.deployments, but no such DynamoGraphDeployment)\n"
    when = _window_clock(cfg, d["deployment"])
    lead = d["leader"] or {}
    lines = [f"{d['deployment']}: {'enabled' if d['enabled'] else 'disabled'}, mode {d['mode']}, "
             f"leader {lead.get('holder') or '-'} (term {lead.get('term') or '-'})"]
    prof = d.get("engine_profile") or {}
    lines.append(f"  engine profile {prof.get('name')} ({prof.get('source')})")
    rep = d.get("replayed_as") or {}
    if rep.get("kind") == "disaggregated":
        pp = rep["prefill_engine_profile"]
        lines.append(f"  replayed as {rep['prefill_workers']} prefill ({pp['name']}, {pp['source']}) + "
                     f"{rep['decode_workers']} decode workers, KV link {rep['kv_transfer_gb_s']:g} GB/s")
    elif rep:
        lines.append(f"  replayed as {rep['workers']} aggregated workers")
    if d["corrupt_state"]:
        lines.append(f"  state: CORRUPT ({d['corrupt_state']}); replaced at the next claim")
    st = d["state"]
    if st:
        desired = ", ".join(f"{k}={v:g}" for k, v in sorted(st["desired"].items())) if st["desired"] else "none"
        last = when(st["last_window"]) if st["last_window"] is not None else "none"
        lines.append(f"  last window {last}, rollback {st['rollback']}, desired {desired}")
        o = st["outcomes"]
        lines.append(f"  windows ended: {o['decided']} decided, {o['abandoned']} abandoned, {o['dropped']} dropped, "
                     f"{o.get('skipped', 0)} skipped (never launched); "
                     f"in flight: {', '.join(when(p['window']) for p in st['pending']) or 'none'}")
    for h in d["decisions"]:
        extra = [f"{h['requests']} requests"] if h.get("requests") is not None else []
        if h.get("runner_up_margin_pct") is not None:
            extra.append(f"runner-up {_pct(h['runner_up_margin_pct'])} behind")
        if h.get("confidence") is not None:
            extra.append(f"confidence {h['confidence']:.3f}")
        reason = _WINDOW_INDEX.sub(lambda m: f"window {when(int(m.group(1)))}", _without_prefix(h["reason"], h["outcome"]))
        lines.append(f"  window {when(h['window'])}: {h['outcome']}: {reason}" + (f" [{', '.join(extra)}]" if extra else ""))
    for r in d["routers"]:
        conv = {True: "converged", False: "NOT converged", None: "no target"}[r["converged"]]
        lines.append(f"  router {r['pod']}: {conv}" + (f" ({r['error']})" if r.get("error") else
                                                        f" revision {r.get('revision')}"))
    return "\n".join(lines) + "\n"


def _window_clock(cfg: Any, dgd: str) -> Any:
    """Window k as its UTC clock times (``12:05:00-12:10:00 UTC (#k)``): an epoch index alone says nothing."""
    if cfg is None:
        return str
    from datetime import datetime, timezone

    from powerfleet.retune.settings import schedule
    from powerfleet.retune.windows import window

    interval, phase = schedule(cfg, dgd)

    def when(k: int) -> str:
        try:
            w = window(int(k), interval, phase)
            start, end = (datetime.fromtimestamp(t, timezone.utc) for t in (w.start, w.end))
        except (ValueError, OverflowError, OSError):  # an index no clock can show
            return f"#{k}"
        form = "%H:%M:%S" if start.date() == end.date() else "%Y-%m-%d %H:%M:%S"
        day = "" if start.date() == datetime.now(timezone.utc).date() else start.strftime("%Y-%m-%d ")
        return f"{day}{start:{form}}-{end:%H:%M:%S} UTC (#{k})"

    return when


_WINDOW_INDEX = re.compile(r"\bwindow (\d{4,})\b")  # a window a reason names ("moved at window 89806186")


def _pct(value: float) -> str:
    shown = round(value, 2) or 0.0  # never "-0.00 %"
    return f"{shown:.2f} %"


def _without_prefix(reason: str, outcome: str) -> str:
    """Decision reasons start with their outcome ("keep: ..."); the line already says it once."""
    return reason.removeprefix(f"{outcome}: ")
