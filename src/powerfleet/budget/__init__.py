"""powerfleet.budget: replica targets clamped to GPU and power budgets (docs/budget.md).

``planner`` is pure (one deployment's roles and budget in, targets out); ``groups`` shares a
rack/PDU budget among the deployments placed on it; ``program`` is the pure evaluation
program the ``budget.evaluate`` task runs.
"""

from powerfleet.budget.planner import Budget, Plan, PlanError, Reason, RoleFacts, plan

__all__ = ["Budget", "Plan", "PlanError", "Reason", "RoleFacts", "plan"]
