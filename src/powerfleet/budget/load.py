"""An optional load signal turned into a proposal (docs/budget.md).

For each role: ``replicas = max(1, ceil(load / target_per_replica))``, where ``load`` is what
the frontends report for that role (e.g. active requests, or queued prefill tokens) and
``target_per_replica`` the load one replica should carry. The planner then clamps the result
like any other proposal; this formula knows nothing about budgets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MAX_REPLICAS = 100_000  # the bound budget.propose puts on a replica count


def replicas_for_load(load: Mapping[str, float], target_per_replica: Mapping[str, float]) -> dict[str, int]:
    out: dict[str, int] = {}
    for role, value in load.items():
        target = target_per_replica.get(role)
        if target is None:
            raise ValueError(f"target_per_replica.{role}: missing")
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"load.{role}: {value!r} must be a finite non-negative number")
        if not (math.isfinite(target) and target > 0):
            raise ValueError(f"target_per_replica.{role}: {target!r} must be a finite positive number")
        ratio = value / target
        if not ratio <= MAX_REPLICAS:  # also inf (1e300 / 1e-300) and nan: a count no role can have
            raise ValueError(f"load.{role} / target_per_replica.{role} = {ratio:.3g} replicas, over {MAX_REPLICAS}")
        out[role] = max(1, math.ceil(ratio))
    return out
