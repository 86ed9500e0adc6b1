"""powerfleet_budget_* metrics. Gauges are set from the state an evaluation or tick computed;
nothing here calls the API at scrape time. Import after ``prepare_multiprocess`` (the tasks
import it lazily)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

_MODE = "livemostrecent"
BUDGET = Gauge("powerfleet_budget_power_limit_watts", "Power limit a deployment was planned against",
               ["deployment"], multiprocess_mode=_MODE)
SETTLED = Gauge("powerfleet_budget_projected_settled_watts", "Projected watts once the targets are reached",
                ["deployment"], multiprocess_mode=_MODE)
PEAK = Gauge("powerfleet_budget_projected_peak_watts", "Projected watts during the transition",
             ["deployment"], multiprocess_mode=_MODE)
UTILISATION = Gauge("powerfleet_budget_utilization_ratio", "Projected settled watts / power limit",
                    ["deployment"], multiprocess_mode=_MODE)
OVER = Gauge("powerfleet_budget_over_budget_watts",
             "Watts a deployment holds above the limit it is planned against (0: within it)",
             ["deployment"], multiprocess_mode=_MODE)
GPUS = Gauge("powerfleet_budget_gpus", "GPUs at the targets", ["deployment"], multiprocess_mode=_MODE)
DECISIONS = Counter("powerfleet_budget_decisions_total", "Clamps and holds by reason", ["deployment", "reason"])
# Each replica write that changed a count (the scale's detail: the status's ``lastScale``).
SCALES = Counter("powerfleet_budget_scales_total", "Replica writes that changed a deployment's counts", ["deployment"])
OUTCOMES = Counter("powerfleet_budget_evaluations_total", "Evaluations by outcome (status reason)",
                   ["deployment", "outcome"])
GROUP_BUDGET = Gauge("powerfleet_budget_group_budget_watts", "A group's budget", ["group"], multiprocess_mode=_MODE)
GROUP_CURRENT = Gauge("powerfleet_budget_group_current_watts",
                      "The group's ledger: projected watts of every GPU pod on its nodes at current counts "
                      "(listed deployments and unmanaged pods)",
                      ["group"], multiprocess_mode=_MODE)
GROUP_PEAK = Gauge("powerfleet_budget_group_projected_peak_watts",
                   "Bound on a group's transition peak: sum over its deployments of max(current, planning limit)",
                   ["group"], multiprocess_mode=_MODE)
GROUP_UNMANAGED = Gauge("powerfleet_budget_group_unmanaged_watts",
                        "Part of the ledger charged for GPU pods no listed deployment owns", ["group"],
                        multiprocess_mode=_MODE)
GROUP_MEASURED = Gauge("powerfleet_budget_group_measured_watts",
                       "Draw the node agents report for the group's GPUs (absent while no agent reports)",
                       ["group"], multiprocess_mode=_MODE)
GROUP_UTILISATION = Gauge("powerfleet_budget_group_utilization_ratio", "Group current watts / group budget",
                          ["group"], multiprocess_mode=_MODE)


def record_evaluation(deployment: str, outcome: str, limit_w: int | None, settled_w: int | None,
                      peak_w: int | None, gpus: int | None, reasons: Iterable[str], over_w: int | None = None,
                      scaled: bool = False) -> None:
    OUTCOMES.labels(deployment=deployment, outcome=outcome).inc()
    if scaled:
        SCALES.labels(deployment=deployment).inc()
    if over_w is not None:
        OVER.labels(deployment=deployment).set(over_w)
    if limit_w is None or settled_w is None or peak_w is None or gpus is None:
        return
    BUDGET.labels(deployment=deployment).set(limit_w)
    SETTLED.labels(deployment=deployment).set(settled_w)
    PEAK.labels(deployment=deployment).set(peak_w)
    UTILISATION.labels(deployment=deployment).set(settled_w / limit_w if limit_w else 0.0)
    GPUS.labels(deployment=deployment).set(gpus)
    for reason in reasons:
        DECISIONS.labels(deployment=deployment, reason=reason).inc()


def record_group(group: str, budget_w: int, current_w: int, peak_w: int, *, unmanaged_w: int = 0,
                 measured_w: float | None = None) -> None:
    GROUP_BUDGET.labels(group=group).set(budget_w)
    GROUP_CURRENT.labels(group=group).set(current_w)
    GROUP_UNMANAGED.labels(group=group).set(unmanaged_w)
    if measured_w is not None:
        GROUP_MEASURED.labels(group=group).set(measured_w)
    GROUP_PEAK.labels(group=group).set(peak_w)
    GROUP_UTILISATION.labels(group=group).set(current_w / budget_w if budget_w else 0.0)
