"""Budget tasks: the evaluation tick (the planner that fills it is its own issue)."""

from __future__ import annotations

from typing import Any

from powerfleet.beat.ticklog import TickLog
from powerfleet.tasks.base import NoArgs, TaskArgs, fleet_task
from powerfleet.tasks.ports import clock, fleet_redis


class BudgetTickResult(TaskArgs):
    at: float
    evaluations: list[str]


@fleet_task("powerfleet.budget.tick", NoArgs, acks_late=False)
def budget_tick(self: Any, params: NoArgs) -> BudgetTickResult:
    now = clock.now()
    TickLog(fleet_redis(self.app)).record("budget", now, self.request.origin, "no deployments to evaluate")
    return BudgetTickResult(at=now, evaluations=[])
