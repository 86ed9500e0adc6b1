"""Group (rack, PDU) budgets shared among the deployments placed on a group's nodes (pure).

A group is the set of nodes carrying one value of the configured node label. The watts of
every pod placed on those nodes must fit the group's budget, settled and through every
transition. The rule (docs/budget.md):

1. **Shares, max-min fair over minimum footprints.** Each deployment is first granted its
   minimum footprint (it can always run); the rest of the budget is water-filled over what
   each deployment wants beyond that (its settled demand), so no deployment can starve another
   by asking for more, and what one does not want flows to the others.
2. **Growth only into free watts.** A deployment may grow only into watts that are free *now*
   (budget - what every deployment draws or may draw at its current counts), split max-min
   fair among the growers. A deployment above its share shrinks this evaluation; the watts it
   frees are handed out at the next one, so the group's transition peak never exceeds it.

The limit a deployment plans against is then ``min(own limit, share, current + growth)``.
Since every deployment's peak stays at or below ``max(current, current + growth)``, the sum of
peaks stays at or below the budget whenever the group's current draw fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    """One deployment's figures on one group (watts)."""

    minimum_w: int  # minimum footprint: sum(min replicas x watts per replica)
    demand_w: int  # settled watts it would draw at its proposals (unproposed roles at ready)
    current_w: int  # what it draws or may draw now: max of desired, ready and live-pod counts
    own_limit_w: int  # its own power limit


@dataclass(frozen=True)
class Allowance:
    share_w: int
    growth_w: int
    limit_w: int  # the limit its planner uses


@dataclass(frozen=True)
class GroupResult:
    budget_w: int
    allowances: dict[str, Allowance]
    feasible: bool  # False: the minimum footprints alone exceed the budget (growth is refused)
    current_w: int


def water_fill(wants: Mapping[str, int], capacity: int) -> dict[str, int]:
    """Max-min fair integer split of ``capacity`` over ``wants`` (nobody gets more than it wants).

    Leftover units from integer division go to the deployments in name order, which keeps the
    result deterministic.
    """
    out = {k: 0 for k in wants}
    left = max(0, capacity)
    open_ = sorted(k for k, w in wants.items() if w > 0)
    while left > 0 and open_:
        level = left // len(open_)
        if level == 0:
            for k in open_[:left]:
                out[k] += 1
            break
        still: list[str] = []
        for k in open_:
            give = min(level, wants[k] - out[k])
            out[k] += give
            left -= give
            if out[k] < wants[k]:
                still.append(k)
        open_ = still
    return out


def allocate(budget_w: int, members: Mapping[str, Member]) -> GroupResult:
    """Shares, growth allowances and planning limits for every deployment on one group."""
    current = sum(m.current_w for m in members.values())
    minimum = sum(m.minimum_w for m in members.values())
    if minimum > budget_w:
        # The minimum footprints do not fit: nobody grows; everyone keeps its current state at most.
        allowances = {k: Allowance(share_w=m.minimum_w, growth_w=0, limit_w=min(m.own_limit_w, m.current_w))
                      for k, m in members.items()}
        return GroupResult(budget_w, allowances, feasible=False, current_w=current)
    extra = water_fill({k: max(0, min(m.demand_w, m.own_limit_w) - m.minimum_w) for k, m in members.items()},
                       budget_w - minimum)
    shares = {k: m.minimum_w + extra[k] for k, m in members.items()}
    growth = water_fill({k: max(0, min(m.own_limit_w, shares[k]) - m.current_w) for k, m in members.items()},
                        budget_w - current)
    allowances = {
        k: Allowance(share_w=shares[k], growth_w=growth[k],
                     limit_w=min(m.own_limit_w, shares[k], m.current_w + growth[k]))
        for k, m in members.items()
    }
    return GroupResult(budget_w, allowances, feasible=True, current_w=current)
