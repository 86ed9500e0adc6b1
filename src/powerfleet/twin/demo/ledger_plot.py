"""The demo report's ledger plot (issue 18 item 9): per rack, the budget's projected watts (its
ledger: every GPU pod on the rack's nodes at its charge, plus the replicas of the deployments
that may land there and hold no node yet), the draw the node agents report for
the rack's GPUs, and the rack's limit, against time. The figures are the ones each budget tick
recorded (``BudgetState.group_history``), so the plot shows what powerfleet computed, not a
recomputation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from powerfleet.twin.demo.view import clock

LEDGER_IMAGE = "ledger.png"
LEDGER_DATA = "ledger.json"  # the plotted series, for a reader who wants the figures


def ledger_series(history: Sequence[Mapping[str, Any]], t0: float) -> dict[str, dict[str, list[Any]]]:
    """group -> {"t", "limit_w", "projected_w", "measured_w"} lists (measured None where no agent
    reported), from the recorded ticks, in time order."""
    out: dict[str, dict[str, list[Any]]] = {}
    for entry in sorted(history, key=lambda e: float(e.get("at") or 0.0)):
        for group, fig in (entry.get("groups") or {}).items():
            if not isinstance(fig, Mapping):
                continue
            s = out.setdefault(group, {"t": [], "limit_w": [], "projected_w": [], "measured_w": []})
            s["t"].append(float(entry.get("at") or 0.0) - t0)
            for key in ("limit_w", "projected_w", "measured_w"):
                s[key].append(fig.get(key))
    return out


def plot_ledger(out: Path, history: Sequence[Mapping[str, Any]], t0: float, limit_at: Any = None) -> str:
    """Write ``ledger.png`` (and its series as ``ledger.json``) under ``out``; return the image's name.
    ``limit_at(rack, t)``: the rack's limit in force (the figure the power plot and the lines show);
    without it, the planning limit the tick recorded."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4))
    series = ledger_series(history, t0)
    (out / LEDGER_DATA).write_text(json.dumps(series, sort_keys=True))
    for i, (group, s) in enumerate(sorted(series.items())):
        color = f"C{i}"
        # Racks may record the same figures for a while (a wider line underneath keeps each visible).
        ax.step(s["t"], s["projected_w"], where="post", color=color, linewidth=max(1.0, 3.5 - 1.5 * i),
                label=f"{group} projected (ledger)")
        measured = [float("nan") if m is None else m for m in s["measured_w"]]
        ax.plot(s["t"], measured, color=color, linestyle=":", marker=".", markersize=3,
                label=f"{group} measured (agents)")
        limit = [limit_at(group, t0 + t) for t in s["t"]] if limit_at is not None else s["limit_w"]
        ax.step(s["t"], limit, where="post", color=color, linestyle=(i * 4, (4, 4)), label=f"{group} limit")
    if not series:
        ax.text(0.5, 0.5, "no budget tick recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(f"seconds since {clock(t0)} (the live view's clock)")
    ax.set_ylabel("GPU power (W)")
    from powerfleet.twin.gpus.power import IDLE_W

    ax.set_title("Budget per rack: projected (the ledger) and measured against the limit\n(the planner keeps its "
                 f"projection under the limit less {IDLE_W:.0f} W for each GPU no pod holds: their idle draw)",
                 fontsize=10)
    ax.set_ylim(bottom=0)
    if series:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(out / LEDGER_IMAGE, dpi=100)
    plt.close(fig)
    return LEDGER_IMAGE
