"""A scenario's own checks (pure): each rack within its limit by what its pods may draw, each
deployment within its SLA or the binding cause named, retune applied (docs/twin.md "Checks").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from powerfleet.twin.demo.checks import Check
from powerfleet.twin.runtime import Sample
from powerfleet.twin.cluster.topology import GPU_MIN_W

SLO_ATTAINMENT = 0.9  # within its SLA: at least this share of its windows at or under the TTFT target
BINDING = ("power_", "gpu_capacity")  # budget reasons that say the budget or the GPUs bound its scale


def no_rack_over_limit(samples: Sequence[Sample], rack_of: Mapping[str, str],
                       limits: Mapping[str, float], since: float | None = None) -> Check:
    """Every rack's physical watts (every pod on its nodes at the larger of its annotation and its
    enforced limit) at or under the rack's limit in every sample where the pods' minimums fit, from
    ``since`` (the agents' first pass: before it a GPU still has its default limit; those samples are
    counted, not judged)."""
    name = "no_rack_over_limit"
    early = sum(1 for s in samples if since is not None and s.t < since)
    samples = [s for s in samples if since is None or s.t >= since]
    if not samples:
        return Check(name, False, "no power samples were taken" + (f" after the agents' first pass ({early} before)"
                                                                    if early else ""))
    worst: tuple[float, str, float] | None = None
    excused = 0
    figures: dict[str, dict[str, float | None]] = {}
    for s in samples:
        racks: dict[str, list[float]] = {}
        for g in s.gpus:
            if g.pod is None:
                continue
            want = s.annotated_w.get(f"{g.node}/{g.index}")
            acc = racks.setdefault(rack_of.get(g.node, "?"), [0.0, 0.0])
            acc[0] += max(want or 0.0, g.cap_w)
            acc[1] += GPU_MIN_W
        for rack in set(racks) | set(s.rack_w):
            phys, minimum = racks.get(rack, [0.0, 0.0])
            limit = (s.rack_budget_w or limits).get(rack, limits.get(rack, 0.0))
            f = figures.setdefault(rack, {"limit_w": limit, "limit_w_min": limit, "physical_w_max": 0.0,
                                          "measured_w_max": 0.0})
            f["limit_w"], f["limit_w_min"] = limit, min(f["limit_w_min"] or limit, limit)
            f["physical_w_max"] = max(f["physical_w_max"] or 0.0, round(phys, 1))
            f["measured_w_max"] = max(f["measured_w_max"] or 0.0, s.rack_w.get(rack, 0.0))
            if phys > limit:
                if minimum > limit:
                    excused += 1
                elif worst is None or phys - limit > worst[0]:
                    worst = (phys - limit, rack, s.t)
    note = f"; {excused} rack samples where the pods' minimums exceeded the limit (not judged)" if excused else ""
    if early:
        note += f"; {early} samples before the agents' first pass (not judged)"
    if worst is not None:
        return Check(name, False, f"rack {worst[1]} {worst[0]:.0f} W over its limit at t={worst[2]:.0f}{note}",
                     {"racks": figures})
    peaks = ", ".join(f"{r} {f['physical_w_max']:.0f} of {f['limit_w']:.0f} W" for r, f in sorted(figures.items()))
    return Check(name, True, f"{len(samples)} samples; physical peak {peaks}{note}", {"racks": figures})


def reasons_during(changes: Sequence[tuple[float, Iterable[str]]], start: float, end: float) -> set[str]:
    """The budget's reasons in force at any time in [start, end): ``changes`` is (time, reasons) at each
    change of a deployment's persisted reasons, in time order."""
    out: set[str] = set()
    before = [r for t, r in changes if t <= start]
    if before:
        out.update(before[-1])
    for t, r in changes:
        if start < t < end:
            out.update(r)
    return out


def slo(windows: Iterable[Any], slas: Mapping[str, float], reasons: Mapping[str, Iterable[str]],
        racks_of: Mapping[str, Iterable[str]], since: Mapping[str, float] | None = None,
        itl: Mapping[str, float] | None = None,
        reasons_at: Mapping[str, Sequence[tuple[float, Iterable[str]]]] | None = None,
        window_s: float | None = None) -> Check:
    """Each deployment with an SLA within it (at least SLO_ATTAINMENT of its windows at or under the
    TTFT target (``slas``) and, where it has one, the ITL target (``itl``), each the window's mean,
    counting the windows that start at or after ``since``), or the budget's reason that bound it
    named, with what would lift it. A window whose ITL was not measured (no request decoded past its
    first token) is judged by its TTFT alone. With ``reasons_at`` (each deployment's reasons as they
    changed) and ``window_s``, a reason binds only where it was in force during a missed window: a
    clamp earlier in the run does not explain a miss while the deployment was at what it asked for."""
    name = "slo"
    by_dgd: dict[str, list[tuple[float, float | None, float]]] = {}
    for w in windows:
        if w.ttft_ms_current is not None and w.start >= (since or {}).get(w.dgd, float("-inf")):
            by_dgd.setdefault(w.dgd, []).append((float(w.ttft_ms_current), getattr(w, "itl_ms_current", None),
                                                 float(w.start)))
    figures: dict[str, dict[str, Any]] = {}
    parts, bad = [], []
    for dgd, target in sorted(slas.items()):
        seen = by_dgd.get(dgd, [])
        ttfts = [t for t, _, _ in seen]
        itls = [i for _, i, _ in seen if i is not None]
        itl_target = (itl or {}).get(dgd)
        missed = [s0 for t, i, s0 in seen if t > target or (itl_target is not None and i is not None and i > itl_target)]
        att = (len(seen) - len(missed)) / len(seen) if seen else None
        if reasons_at is not None and window_s is not None:
            during: set[str] = set()
            for s0 in missed:
                during |= reasons_during(reasons_at.get(dgd, ()), s0, s0 + window_s)
            binding = sorted(r for r in during if r.startswith(BINDING))
        else:
            binding = sorted({r for r in reasons.get(dgd, ()) if r.startswith(BINDING)})
        f: dict[str, Any] = {"ttft_ms_target": target, "windows": len(ttfts),
                             "attainment": None if att is None else round(att, 3),
                             "ttft_ms_mean": round(sum(ttfts) / len(ttfts), 1) if ttfts else None,
                             "ttft_ms_worst": round(max(ttfts), 1) if ttfts else None, "binding": binding}
        if itl_target is not None:
            f.update(itl_ms_target=itl_target, itl_windows=len(itls),
                     itl_ms_mean=round(sum(itls) / len(itls), 2) if itls else None,
                     itl_ms_worst=round(max(itls), 2) if itls else None)
        figures[dgd] = f
        goal = f"{target:g} ms" + (f" TTFT and {itl_target:g} ms ITL" if itl_target is not None else "")
        worst = f"worst {f['ttft_ms_worst']:.0f} ms" if ttfts else ""
        over = f", {f['ttft_ms_worst'] - target:.0f} ms over" if ttfts else ""
        worst_itl = f", worst ITL {f['itl_ms_worst']:.1f} ms" if itl_target is not None and itls else ""
        if att is None:
            bad.append(f"{dgd}: no window measured its TTFT")
        elif att >= SLO_ATTAINMENT:
            parts.append(f"{dgd} {att:.0%} of {len(seen)} windows within {goal}")
        elif binding:
            lever = ("raise the limit of " + "/".join(sorted(racks_of.get(dgd, ()))) + " or lower other "
                     "deployments' caps") if any(b.startswith("power_") for b in binding) else \
                "add GPUs to its racks or free the tenants' GPUs"
            f["operator_could"] = lever
            parts.append(f"{dgd} {att:.0%} within {goal} ({worst}{over}{worst_itl}): bound by {', '.join(binding)}; "
                         f"{lever}")
        else:
            bad.append(f"{dgd} {att:.0%} of {len(seen)} windows within {goal} ({worst}{worst_itl}) and nothing bound "
                       "its scale")
    if not slas:
        return Check(name, False, "no deployment has an SLA", {"deployments": figures})
    return Check(name, not bad, "; ".join(bad + parts), {"deployments": figures})


def retune_applied(history: Mapping[str, Sequence[Mapping[str, Any]]]) -> Check:
    applied = [(d, h.get("window")) for d, hs in history.items() for h in hs if h.get("outcome") == "apply"]
    from powerfleet.twin.demo.scenario import DECIDED

    decided = sum(1 for hs in history.values() for h in hs if h.get("outcome") in DECIDED)
    return Check("retune_applied", bool(applied), f"{decided} windows decided, {len(applied)} applied")
