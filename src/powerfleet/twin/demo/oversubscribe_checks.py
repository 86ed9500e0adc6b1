"""The oversubscription demo's self-checks and figures, as pure functions of what it recorded
(docs/power.md, "The twin scenario").

Records: the twin's 1-second samples (``Sample``: every GPU's true draw, cap in force and pod)
and the scenario's own finer record of the caps in force (``CapChange``, polled from the GPU
files every 0.1 s), plus the time of the last report with telemetry the lost node published.
The guarded set is every GPU of the group's nodes that holds a pod (an idle GPU is outside it:
docs/power.md, "Live").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerfleet.twin.demo.checks import Check
from powerfleet.twin.runtime import Sample

TOLERANCE_W = 0.5  # NVML limits are whole milliwatts; the agent rounds to whole watts


@dataclass(frozen=True)
class CapChange:
    t: float
    node: str
    index: int
    from_w: float
    to_w: float


def guarded_draw(s: Sample, nodes: Iterable[str]) -> float:
    on = set(nodes)
    return sum(g.draw_w for g in s.gpus if g.pod is not None and g.node in on)


def excursion_runs(samples: Sequence[Sample], nodes: Iterable[str], limit_w: float) -> list[tuple[float, int, float]]:
    """Each run of consecutive samples above the limit: (start, samples in it, largest overshoot W)."""
    nodes = list(nodes)
    runs: list[tuple[float, int, float]] = []
    start, count, worst = 0.0, 0, 0.0
    for s in samples:
        over = guarded_draw(s, nodes) - limit_w
        if over > 0:
            if count == 0:
                start, worst = s.t, 0.0
            count, worst = count + 1, max(worst, over)
        elif count:
            runs.append((start, count, worst))
            count = 0
    if count:
        runs.append((start, count, worst))
    return runs


def no_long_excursion(samples: Sequence[Sample], nodes: Iterable[str], limit_w: float, period_s: float,
                      tick_s: float) -> Check:
    """No run of 1-second samples above the limit longer than two guard periods."""
    name = "no_excursion_beyond_two_periods"
    if not samples:
        return Check(name, False, "no power samples were taken")
    runs = excursion_runs(samples, nodes, limit_w)
    longest = max((n for _, n, _ in runs), default=0) * tick_s
    over = max((w for _, _, w in runs), default=0.0)
    detail = (f"{len(runs)} excursions above {limit_w:.0f} W in {len(samples)} samples; longest {longest:.0f} s "
              f"(allowed {2 * period_s:g} s), largest overshoot {over:.0f} W")
    return Check(name, longest <= 2 * period_s + 1e-9, detail)


def safe_bound_at(changes: Sequence[CapChange], initial: Mapping[tuple[str, int], float],
                  safe: Mapping[tuple[str, int], float], since: float) -> float | None:
    """The first time at or after ``since`` at which every GPU in ``safe`` is at its safe cap (a GPU
    the guard happened to hold lower is not yet in the fallback state: it is judged when it gets
    there). ``initial``: the caps in force at ``since``; ``changes``: every change after it, in time order."""
    caps = dict(initial)

    def at_safe() -> bool:
        return bool(safe) and all(abs(caps.get(k, float("inf")) - w) <= TOLERANCE_W for k, w in safe.items())

    if at_safe():
        return since
    for c in changes:
        if c.t < since:
            continue
        caps[(c.node, c.index)] = c.to_w
        if at_safe():
            return c.t
    return None


def fallback_check(loss_at: float | None, last_report_at: float | None, bound_at: float | None,
                   period_s: float) -> Check:
    """Every guarded GPU of the lost node at its safe cap within one period of its telemetry being
    older than two periods (the issue's definition of lost: the last report with a draw + 2 periods)."""
    name = "fallback_within_one_period"
    if loss_at is None:
        return Check(name, False, "the telemetry loss was not started")
    if last_report_at is None:
        return Check(name, False, "the node never published a report with its draw before the loss")
    if bound_at is None:
        return Check(name, False, "the node's GPUs never reached their safe caps during the loss")
    lost = last_report_at + 2 * period_s
    late = bound_at - lost
    return Check(name, late <= period_s, (
        f"last report with a draw {last_report_at - loss_at:+.2f} s from the loss, lost (2 periods old) "
        f"{lost - loss_at:+.2f} s, every GPU at its safe cap {bound_at - loss_at:+.2f} s: "
        f"{max(late, 0.0):.2f} s after it was lost (allowed one period, {period_s:g} s)"))


def reaction_times(samples: Sequence[Sample], nodes: Iterable[str], threshold_w: float,
                   changes: Sequence[CapChange]) -> list[float]:
    """For each crossing of the threshold (a sample above it after one at or below it): seconds until
    the next lowered cap on a GPU of the group's nodes."""
    nodes = set(nodes)
    lowered = sorted(c.t for c in changes if c.node in nodes and c.to_w < c.from_w - TOLERANCE_W)
    out: list[float] = []
    before = None
    for s in samples:
        w = guarded_draw(s, nodes)
        if before is not None and before <= threshold_w < w:
            nxt = next((t for t in lowered if t >= s.t), None)
            if nxt is not None:
                out.append(nxt - s.t)
        before = w
    return out


def throttled(samples: Sequence[Sample], nodes: Iterable[str], dgd_of: Mapping[str, str],
              priority: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Per deployment: GPU-seconds held below the annotation, the deepest cap as a fraction of it,
    and its priority. ``dgd_of``: pod name -> deployment."""
    on = set(nodes)
    out: dict[str, dict[str, float]] = {}
    for i, s in enumerate(samples):
        dt = samples[i + 1].t - s.t if i + 1 < len(samples) else 0.0
        for g in s.gpus:
            want = s.annotated_w.get(f"{g.node}/{g.index}")
            if g.pod is None or g.node not in on or not want:
                continue
            dgd = dgd_of.get(g.pod, g.pod)
            row = out.setdefault(dgd, {"gpu_s_throttled": 0.0, "deepest_fraction": 1.0})
            if g.cap_w < want - TOLERANCE_W:
                row["gpu_s_throttled"] += dt
                row["deepest_fraction"] = min(row["deepest_fraction"], g.cap_w / want)
    return {d: {"priority": priority.get(d, "high"), "gpu_s_throttled": round(r["gpu_s_throttled"], 1),
                "deepest_fraction": round(r["deepest_fraction"], 3)} for d, r in sorted(out.items())}
