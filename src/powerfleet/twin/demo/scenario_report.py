"""The scenario's part of ``summary.json`` (pure): ``scenario_result`` answers, for a program,
whether each check held and with which figures, each rack's limit against the most its pods
could draw, the draw measured and the ledger's projection, each deployment's SLA attainment,
and when each event acted and took effect (seconds from the scenario's start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from powerfleet.twin.demo.checks import Check


def _s(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 1)


def scenario_result(plan: Any, file: str | None, steps: Sequence[Any], at_s: Mapping[str, float],
                    checks: Sequence[Check], ledger: Sequence[Mapping[str, Any]] | None, t0: float) -> dict[str, Any]:
    by_name = {c.name: c for c in checks}
    racks: dict[str, dict[str, Any]] = {r: {"limit_w": None, "physical_w_max": None, "measured_w_max": None,
                                            "projected_w_max": None} for r in plan.topology.racks}
    rack_check = by_name.get("no_rack_over_limit")
    for rack, f in ((rack_check.figures.get("racks") if rack_check else None) or {}).items():
        if rack in racks:
            racks[rack].update(f)
    for entry in ledger or ():
        for rack, g in (entry.get("groups") or {}).items():
            if rack in racks and isinstance(g.get("projected_w"), (int, float)):
                racks[rack]["projected_w_max"] = max(racks[rack]["projected_w_max"] or 0, g["projected_w"])
                racks[rack]["planning_limit_w"] = g.get("limit_w")
    slo = by_name.get("slo")
    deployments = {d: {"sla_ttft_ms": None if x.sla is None else x.sla.ttft_ms,
                       "sla_itl_ms": None if x.sla is None else x.sla.itl_ms,
                       **((slo.figures.get("deployments") or {}).get(d, {}) if slo else {})}
                   for d, x in plan.deployments.items()}
    events = []
    for step, e in zip(steps, plan.events):
        o = step.outcome
        events.append({"name": step.name, "kind": e.kind, "at_s": round(at_s.get(step.name, 0.0), 1),
                       "started_s": _s(o.started_at, t0), "took_effect_s": _s(o.held_at, t0), "state": o.state,
                       "detail": o.detail})
    return {"name": plan.name, "file": file, "held": all(c.ok for c in checks),
            "checks": {c.name: {"held": c.ok, "detail": c.detail, **dict(c.figures)} for c in checks},
            "racks": racks, "deployments": deployments, "events": events}
