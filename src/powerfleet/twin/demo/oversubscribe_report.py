"""The oversubscription demo's part of the report: ``summary.json``'s ``oversubscribe`` section,
``oversubscribe.png`` and a section of ``index.html`` (docs/power.md, "The twin scenario").

It extends what ``twin.demo.report.write_report`` wrote (one call from the demo run), so the default
report is unchanged: the measured (guarded) draw against the limit over time with the surge and
the telemetry loss marked, who the guard throttled and by how much, the guard's reaction times,
the excursions and the fallback.
"""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from powerfleet.twin.demo.oversubscribe import T2, OversubscribeScenario
from powerfleet.twin.demo.oversubscribe_checks import excursion_runs, guarded_draw, reaction_times, throttled
from powerfleet.twin.runtime import Sample
from powerfleet.twin.demo.view import clock

IMAGE = "oversubscribe.png"


def section(sc: OversubscribeScenario, samples: Sequence[Sample]) -> dict[str, Any]:
    t0 = samples[0].t if samples else 0.0
    draw = [guarded_draw(s, sc.nodes) for s in samples]
    reactions = reaction_times(samples, sc.nodes, T2 * sc.limit_w, sc.rec.changes)
    rel = (lambda t: None if t is None else round(t - t0, 2))  # noqa: E731 - seconds since the first sample
    return {
        "group": sc.plan.group, "nodes": sc.nodes, "limit_w": sc.limit_w, "ratio": sc.plan.ratio,
        "requested_w": round(sc.limit_w * sc.plan.ratio), "period_s": sc.period_s,
        "guarded_draw_w": {"mean": round(statistics.fmean(draw), 1) if draw else 0.0,
                           "max": round(max(draw), 1) if draw else 0.0},
        "series": [{"t": round(s.t - t0, 2), "guarded_w": round(w, 1), "rack_w": s.rack_w.get(sc.plan.group, 0.0)}
                   for s, w in zip(samples, draw)],
        "excursions": [{"t": round(t - t0, 1), "seconds": n, "max_over_w": round(w, 1)}
                       for t, n, w in excursion_runs(samples, sc.nodes, sc.limit_w)],
        "throttled": throttled(list(samples), sc.nodes, sc.dgd_of(list(samples)), sc.priority),
        "reaction_s": [round(r, 2) for r in reactions],
        "cap_changes": [{"t": round(c.t - t0, 2), "gpu": f"{c.node}/{c.index}", "from_w": c.from_w, "to_w": c.to_w}
                        for c in sc.rec.changes],
        "surge": {"from_s": rel(sc.rec.surge_at), "to_s": rel(sc.rec.surge_end)},
        "telemetry_loss": {"node": sc.lost_node, "from_s": rel(sc.rec.loss_at), "to_s": rel(sc.rec.loss_end),
                           "last_report_with_draw_s": rel(sc.rec.last_report_at)},
    }


def _plot(out: Path, sec: dict[str, Any], t0: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = [p["t"] for p in sec["series"]]
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.plot(ts, [p["guarded_w"] for p in sec["series"]], color="C0", label="measured draw of the guarded GPUs")
    ax.plot(ts, [p["rack_w"] for p in sec["series"]], color="C7", linewidth=0.8,
            label=f"{sec['group']} total (idle GPUs included)")
    ax.axhline(sec["limit_w"], color="C3", linestyle="--", label=f"limit {sec['limit_w']:.0f} W")
    ax.axhline(sec["requested_w"], color="C2", linestyle=":", label=f"requested caps {sec['requested_w']:.0f} W")
    for key, color, label in (("surge", "C1", "demand surge"), ("telemetry_loss", "C4", "telemetry loss")):
        a, b = sec[key]["from_s"], sec[key]["to_s"]
        if a is not None:
            ax.axvspan(a, b if b is not None else (ts[-1] if ts else a), color=color, alpha=0.12, label=label)
    ax.set_xlabel(f"seconds since {clock(t0)} (the live view's clock)")
    ax.set_ylabel("GPU power (W)")
    ax.set_title(f"{sec['group']} oversubscribed {sec['ratio']:g}x: measured draw against the limit")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(out / IMAGE, dpi=100)
    plt.close(fig)


def _html(sec: dict[str, Any]) -> str:
    rows = "".join(f"<tr><td>{html.escape(d)}</td><td>{html.escape(str(r['priority']))}</td>"
                   f"<td>{r['gpu_s_throttled']:.0f}</td><td>{r['deepest_fraction'] * 100:.0f} %</td></tr>"
                   for d, r in sec["throttled"].items())
    exc = sec["excursions"]
    longest = max((e["seconds"] for e in exc), default=0)
    worst = max((e["max_over_w"] for e in exc), default=0.0)
    react = sec["reaction_s"]
    react_text = (f"median {statistics.median(react):.2f} s, max {max(react):.2f} s over {len(react)} crossings"
                  if react else "no crossing")
    loss = sec["telemetry_loss"]
    return f"""<h2>Oversubscription: {html.escape(sec['group'])} at {sec['ratio']:g}x</h2>
<p>Limit {sec['limit_w']:.0f} W; the pods request {sec['requested_w']:.0f} W of caps. Measured draw of the guarded
GPUs: mean {sec['guarded_draw_w']['mean']:.0f} W, max {sec['guarded_draw_w']['max']:.0f} W. Excursions above the
limit (1 s samples): {len(exc)}, longest {longest} s, largest {worst:.0f} W over. Guard reaction (draw above
t2 to a lowered cap): {react_text}. Telemetry loss on {html.escape(str(loss['node']))} from
{loss['from_s']} s to {loss['to_s']} s (seconds since the first sample).</p>
<table><tr><th>deployment</th><th>priority</th><th>GPU-seconds throttled</th><th>deepest cap (of its request)</th></tr>
{rows}</table>
<figure><img src="{IMAGE}" alt="{IMAGE}"></figure>
"""


def extend(out: Path, summary: dict[str, Any], samples: Sequence[Sample], sc: OversubscribeScenario) -> None:
    """Add the section to a report ``twin.demo.report.write_report`` has written in ``out``."""
    sec = section(sc, samples)
    summary["oversubscribe"] = sec
    summary["images"] = [*summary.get("images", []), IMAGE]
    _plot(out, sec, samples[0].t if samples else 0.0)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=False))
    index = out / "index.html"
    page = index.read_text()
    index.write_text(page.replace("<h2>Plots</h2>", _html(sec) + "<h2>Plots</h2>", 1))
