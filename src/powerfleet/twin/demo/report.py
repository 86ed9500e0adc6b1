"""The demo report: ``summary.json``, PNG plots and an ``index.html`` that shows them.

``summary.json`` (schema ``powerfleet.demo-report/v1``) holds every figure the live view
showed (the final view state, per-rack and fleet power statistics, caps per GPU, the
scenario's steps, retune windows with their TTFT) and ``checks``: one entry per check,
``true`` when it held (``check_details`` says what was measured).

Plots (matplotlib, Agg backend, no display needed):
``power.png`` power per rack over time against its budget, with the sum of the applied caps
of the rack's GPUs that run pods (what they may draw); ``caps.png`` the applied cap per
deployment and role (the mean over its GPUs, their count in the legend); ``ttft.png`` mean
TTFT per retune window (labelled by its start time), the frontend's settings (retuned)
against the default settings replayed on the same window.

``timeline`` lists what happened, in clock time: the run's own events (sweeps launched, retune
decisions, scenario steps, budget evaluations with the limit and the share of the racks' budgets
that set it: ``budget_event``) and every change of a deployment role's caps, read from the samples.
``dropped_requests`` gives each deployment's dropped requests with their cause. Every time axis
counts seconds from the first sample and names its clock time, the clock of the live view.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from powerfleet.twin.demo.checks import Check
from powerfleet.twin.cluster.manifests import AGG, DISAGG
from powerfleet.twin.demo.view import clock
from powerfleet.twin.serving.frontends import WindowTtft
from powerfleet.twin.runtime import Sample

SCHEMA = "powerfleet.demo-report/v1"
IMAGES = ("power.png", "caps.png", "ttft.png")


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"min": 0.0, "mean": 0.0, "max": 0.0}
    return {"min": round(min(values), 1), "mean": round(sum(values) / len(values), 1), "max": round(max(values), 1)}


def cap_group(pod: str | None, role: str | None) -> str:
    """``<deployment>/<role>`` of a GPU's pod, or ``idle`` for a GPU without one."""
    if pod is None:
        return "idle"
    # A DGD's pod is named <dgd>-<component>-<template hash>-<ordinal> (twin/cluster/operator.py).
    m = re.match(rf"^(.+)-{re.escape(role.lower())}-[0-9a-f]{{6}}-\d+$", pod) if role else None
    dgd = m.group(1) if m else next((d for d in sorted((DISAGG, AGG), key=len, reverse=True)
                                     if pod.startswith(d + "-")), pod)
    return f"{dgd}/{role or 'pod'}"


def _caps_by_group(s: Sample) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for g in s.gpus:
        out.setdefault(cap_group(g.pod, g.role), []).append(g.cap_w)
    return out


def _caps_text(caps: Sequence[float]) -> str:
    lo, hi = min(caps), max(caps)
    return f"{lo:.0f} W" if lo == hi else f"{lo:.0f}-{hi:.0f} W"


def cap_events(samples: Sequence[Sample]) -> list[tuple[float, str]]:
    """Each change of a deployment role's applied caps (or of its GPU count), as (time, text)."""
    out: list[tuple[float, str]] = []
    before: dict[str, list[float]] = {}
    for s in samples:
        now = {k: sorted(v) for k, v in _caps_by_group(s).items()}
        for group, caps in sorted(now.items()):
            old = before.get(group)
            if old is not None and old != caps:
                out.append((s.t, f"caps {group}: {_caps_text(old)} on {len(old)} GPUs -> {_caps_text(caps)} "
                                 f"on {len(caps)} GPUs"))
        before = now
    return out


def timeline(samples: Sequence[Sample], events: Sequence[tuple[float, str]]) -> list[dict[str, Any]]:
    t0 = samples[0].t if samples else (events[0][0] if events else 0.0)
    merged = sorted([*events, *cap_events(samples)], key=lambda e: e[0])
    return [{"at": clock(t), "t_s": round(t - t0, 1), "event": text} for t, text in merged]


def budget_event(dgd: str, status: Mapping[str, Any], group_budget_w: Mapping[str, float]) -> str:
    """One budget evaluation as a timeline line: its verdict and reasons, the limit it planned
    against and where that limit came from, the share of its racks' budgets or its own limit.

    ``status`` is what the evaluation persisted (powerLimitWatts = min(own limit, the group
    allowance)); so a limit below the own limit is the deployment's share of its groups. When the
    share is below the deployment's minimum footprint the evaluation plans at the footprint and
    says the share in its message."""
    reasons = [r for r in status.get("reasons") or [] if r]
    head = f"budget {dgd}: {status.get('reason')}" + (f" [{', '.join(reasons)}]" if reasons else "")
    limit, own, group = status.get("powerLimitWatts"), status.get("ownLimitWatts"), status.get("group")
    if limit is None:
        return head
    racks = ", ".join(f"{g} ({group_budget_w[g]:.0f} W)" if g in group_budget_w else g
                      for g in str(group).split(",")) if group else ""
    below = _FOOTPRINT.search(str(status.get("message") or ""))
    if below and racks:
        where = f"its minimum footprint; its share of {racks} is only {below.group(1)} W"
    elif racks and own is not None and limit < own and "," in str(group):
        # Spread over racks, it may grow by the least any of them allows (budget/groups.py
        # allocate_racks): its limit is what it holds now plus that headroom, not a share of each.
        where = f"what it holds now plus the least headroom of {racks.replace(', ', ' and ')}, under its own {own} W"
    elif racks and own is not None and limit < own:
        where = f"its share of {racks}, under its own {own} W"
    elif racks and "," in str(group):
        where = f"its own limit (the least headroom of {racks.replace(', ', ' and ')} allows as much)"
    elif racks:
        where = f"its own limit (its share of {racks} is no lower)"
    else:
        where = "its own limit"
    figures = ", ".join(f"{label} {status[k]} W" for k, label in (("settledWatts", "settled"), ("peakWatts", "peak"))
                        if status.get(k) is not None)
    gpus = f" on {status['gpus']} GPUs" if status.get("gpus") is not None else ""
    return f"{head}: limit {limit} W = {where}" + (f"; {figures}{gpus}" if figures else "")


_FOOTPRINT = re.compile(r"allowance (\d+) W is below the minimum footprint")


def summary(*, samples: Sequence[Sample], windows: Sequence[WindowTtft], checks: Sequence[Check],
            rack_budget_w: Mapping[str, float], fleet_budget_w: float, extra: Mapping[str, Any],
            events: Sequence[tuple[float, str]] = ()) -> dict[str, Any]:
    t0 = samples[0].t if samples else 0.0
    racks = sorted(rack_budget_w)
    last = samples[-1] if samples else None
    return {
        "schema": SCHEMA,
        **extra,
        "power": {
            "samples": len(samples),
            "fleet_budget_w": fleet_budget_w,
            "rack_budget_w": dict(rack_budget_w),
            "fleet_w": _stats([s.fleet_w for s in samples]),
            "rack_w": {r: _stats([s.rack_w.get(r, 0.0) for s in samples]) for r in racks},
            "series": [{"t": round(s.t - t0, 2), "fleet_w": s.fleet_w, "rack_w": s.rack_w} for s in samples],
        },
        "caps_final": {f"{g.node}/{g.index}": {"cap_w": g.cap_w, "draw_w": g.draw_w, "pod": g.pod, "role": g.role}
                       for g in (last.gpus if last else [])},
        "retune_windows": [
            {"dgd": w.dgd, "window": w.window, "requests": w.requests, "workers": w.workers,
             "ttft_ms_retuned": w.ttft_ms_current, "ttft_ms_default": w.ttft_ms_default, "policy": w.policy}
            for w in windows
        ],
        "timeline": timeline(samples, events),
        "checks": {c.name: c.ok for c in checks},
        "check_details": {c.name: c.detail for c in checks},
        "images": list(IMAGES),
    }


def _rack_caps(s: Sample, rack: str, racks: Mapping[str, str]) -> float:
    """What the GPUs running pods in ``rack`` may draw: the sum of their applied caps."""
    return sum(g.cap_w for g in s.gpus if g.pod is not None and racks.get(g.node) == rack)


def _plots(out: Path, samples: Sequence[Sample], windows: Sequence[WindowTtft],
           rack_budget_w: Mapping[str, float], racks: Mapping[str, str], window_s: int = 0) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    t0 = samples[0].t if samples else 0.0
    ts = [s.t - t0 for s in samples]
    xlabel = f"seconds since {clock(t0)} (the live view's clock)"

    fig, ax = plt.subplots(figsize=(11, 4))
    for i, rack in enumerate(sorted(rack_budget_w)):
        color = f"C{i}"
        ax.plot(ts, [s.rack_w.get(rack, 0.0) for s in samples], color=color, label=f"{rack} draw")
        ax.plot(ts, [_rack_caps(s, rack, racks) for s in samples], color=color, linestyle="-.", linewidth=1,
                label=f"{rack} caps of its pods' GPUs")
        # Racks often share one budget figure: offset dash patterns keep both lines visible.
        # The limit in force at each sample (a set_limit moves it), the figure the ledger plot shows.
        ax.step(ts, [(s.rack_budget_w or rack_budget_w).get(rack, rack_budget_w[rack]) for s in samples],
                where="post", color=color, linestyle=(i * 4, (4, 4)), label=f"{rack} budget")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GPU power (W)")
    ax.set_title("Power per rack against its budget")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "power.png", dpi=100)
    plt.close(fig)
    made.append("power.png")

    fig, ax = plt.subplots(figsize=(11, 4))
    groups = sorted({cap_group(g.pod, g.role) for s in samples for g in s.gpus})
    for i, group in enumerate(groups):
        series, counts = [], []
        for s in samples:
            caps = _caps_by_group(s).get(group, [])
            series.append(sum(caps) / len(caps) if caps else float("nan"))
            counts.append(len(caps))
        ax.step(ts, series, where="post", linewidth=1.5, color=f"C{i}",
                label=f"{group} (up to {max(counts) if counts else 0} GPUs)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("applied cap, mean over the GPUs (W)")
    ax.set_title("Applied power cap per deployment and role")
    ax.set_ylim(0, 750)
    if groups:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "caps.png", dpi=100)
    plt.close(fig)
    made.append("caps.png")

    fig, ax = plt.subplots(figsize=(9, 4))
    for i, dgd in enumerate(sorted({w.dgd for w in windows})):
        ws = [w for w in windows if w.dgd == dgd and w.ttft_ms_current is not None]
        xs = list(range(len(ws)))
        ax.plot(xs, [w.ttft_ms_current for w in ws], marker="o", color=f"C{i}", label=f"{dgd} retuned")
        ax.plot(xs, [w.ttft_ms_default for w in ws], marker="x", linestyle="--", color=f"C{i}",
                label=f"{dgd} default settings")
    if windows:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no retune window closed", ha="center", va="center", transform=ax.transAxes)
    if window_s:
        shown = sorted({w.window for w in windows if w.ttft_ms_current is not None})
        ax.set_xticks(range(len(shown)), [clock(k * window_s) for k in shown], rotation=30, fontsize=8)
        ax.set_xlabel(f"retune window ({window_s} s), by its start time")
    else:
        ax.set_xlabel("retune window")
    ax.set_ylabel("mean TTFT (ms)")
    ax.set_title("TTFT per window: the routers' settings against default settings, same requests")
    fig.tight_layout()
    fig.savefig(out / "ttft.png", dpi=100)
    plt.close(fig)
    made.append("ttft.png")
    return made


def _html(data: Mapping[str, Any], images: Sequence[str]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td class={'ok' if ok else 'bad'}>{'held' if ok else 'FAILED'}</td>"
        f"<td>{html.escape(str(data['check_details'].get(name, '')))}</td></tr>"
        for name, ok in data["checks"].items())
    steps = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                    for k, v in (data.get("steps") or {}).items())
    events = "".join(f"<tr><td>{html.escape(e['at'])}</td><td>{e['t_s']:.0f} s</td><td>{html.escape(e['event'])}</td></tr>"
                     for e in data.get("timeline", []))
    dropped = "".join(f"<tr><td>{html.escape(d)}</td><td>{v['requests']}</td><td>{html.escape(v['cause'])}</td></tr>"
                      for d, v in (data.get("dropped_requests") or {}).items()) or \
        "<tr><td colspan=3>none</td></tr>"
    figs = "".join(f'<figure><img src="{html.escape(i)}" alt="{html.escape(i)}"></figure>' for i in images)
    p = data["power"]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>powerfleet demo report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }} td, th {{ border: 1px solid #ccc; padding: .3em .6em; }}
.ok {{ color: #070; font-weight: bold; }} .bad {{ color: #b00; font-weight: bold; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
</style></head><body>
<h1>powerfleet demo report</h1>
<p>{html.escape(str(data.get('nodes', '?')))} nodes, {html.escape(str(data.get('duration_s', '?')))} s,
seed {html.escape(str(data.get('seed', '?')))}; traffic: {html.escape(str(data.get('traffic', '')))}.
Fleet power mean {p['fleet_w']['mean']:.0f} W, peak {p['fleet_w']['max']:.0f} W of a {p['fleet_budget_w']:.0f} W budget.</p>
<h2>Checks</h2><table><tr><th>check</th><th>result</th><th>detail</th></tr>{rows}</table>
<h2>Scenario</h2><table><tr><th>step</th><th>outcome</th></tr>{steps}</table>
<h2>Timeline</h2><table><tr><th>clock</th><th>since start</th><th>what happened</th></tr>{events}</table>
<h2>Dropped requests</h2><table><tr><th>deployment</th><th>requests</th><th>cause</th></tr>{dropped}</table>
<h2>Plots</h2>{figs}
<p>All figures: <a href="summary.json">summary.json</a>.</p>
</body></html>
"""


def limits_of(samples: Sequence[Sample], fallback: Mapping[str, float]) -> Any:
    """(rack, t) -> the rack's limit in force at ``t``: the one budget figure every plot and line
    shows (a set_limit moves it; the samples record it)."""
    import bisect

    times = [s.t for s in samples]

    def at(rack: str, t: float) -> float | None:
        i = bisect.bisect_right(times, t) - 1
        budgets = samples[max(i, 0)].rack_budget_w if samples else {}
        return (budgets or fallback).get(rack, fallback.get(rack))
    return at


def write_report(out: Path, data: dict[str, Any], samples: Sequence[Sample], windows: Sequence[WindowTtft],
                 rack_budget_w: Mapping[str, float], racks: Mapping[str, str] | None = None,
                 ledger: Sequence[Mapping[str, Any]] | None = None) -> Path:
    """``racks``: node -> rack, for the caps line of the power plot (omitted: no caps line).
    ``ledger``: the budget ticks' recorded group figures, plotted as ``ledger.png`` (ledger_plot.py)."""
    out.mkdir(parents=True, exist_ok=True)
    images = _plots(out, samples, windows, rack_budget_w, racks or {}, int(data.get("window_s") or 0))
    assert tuple(images) == IMAGES, images
    if ledger is not None:
        from powerfleet.twin.demo.ledger_plot import plot_ledger

        images.append(plot_ledger(out, ledger, samples[0].t if samples else 0.0, limits_of(samples, rack_budget_w)))
        data["images"] = list(images)
    (out / "summary.json").write_text(json.dumps(data, indent=1, sort_keys=False))
    (out / "index.html").write_text(_html(data, images))
    return out / "index.html"
