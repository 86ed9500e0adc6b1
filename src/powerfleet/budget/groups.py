"""Group (rack, PDU) budgets shared among the deployments placed on a group's nodes (pure).

A group is the set of nodes carrying one value of the configured node label. The watts of
every pod placed on those nodes must fit the group's budget, settled and through every
transition. The rule (docs/budget.md):

1. **Shares, max-min fair over minimum footprints.** Each deployment is first granted its
   minimum footprint (it can always run); the rest of the budget is water-filled over what
   each deployment wants beyond that (its settled demand), so no deployment can starve another
   by asking for more, and what one does not want flows to the others.
   When the minimum footprints (tenants included) exceed the budget, every deployment's limit is
   its minimum footprint: it shrinks there and is reported over its share.
2. **Growth only into free watts.** A deployment may grow only into watts that are free *now*
   (budget - what every deployment draws or may draw at its current counts), split max-min
   fair among the growers. A deployment above its share shrinks this evaluation; the watts it
   frees are handed out at the next one, so the group's transition peak never exceeds it.

The limit a deployment plans against is then ``min(own limit, share, current + growth)``.
Since every deployment's peak stays at or below ``max(current, current + growth)``, the sum of
peaks stays at or below the budget whenever the group's current draw fits.

**A deployment on several groups** (``allocate_racks``) enters each group with its footprint
there (``Footprint.member_on``): what its pods on the group's nodes are charged plus its replicas
that hold no node yet, which the scheduler may put on any of its groups, so each is charged them.
Any growth may land wholly on any one of its groups, so it is granted the smallest change any of
its groups allows: ``limit = min(own, current + min over groups (group limit - footprint there))``,
and, over its share on a group, no more than its limit there in all (the operator picks which pods go).
On a group where it holds no pod (a new pod of it may land there, the scheduler decides) it is
*remote*: it takes part in the split of the free watts, not in the shares, so the growth of many
deployments that may land anywhere never shrinks what a rack's own deployments hold.
A deployment on one group is the single-group rule above, unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    """One deployment's figures on one group (watts)."""

    minimum_w: int  # minimum footprint: sum(min replicas x watts per replica)
    demand_w: int  # settled watts it would draw at its proposals (unproposed roles at ready)
    current_w: int  # what it draws or may draw now: max of desired, ready and live-pod counts
    own_limit_w: int  # its own power limit
    # only here because a new pod of it may land here (it holds no pod on the group, others elsewhere):
    # it shares the free watts with the growers, but claims no share of what the group's holders hold
    remote: bool = False


@dataclass(frozen=True)
class Allowance:
    share_w: int
    growth_w: int
    limit_w: int  # the limit its planner uses
    # It holds more than its fair share of the group at what it holds now (or asks, if more): an
    # overrun. A limit below what it holds only because it asked for less is its own shrink.
    over_share: bool = False


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
        # The minimum footprints do not fit: nobody grows and everyone shrinks to its minimum
        # footprint (the most the group can still be brought down to; its evaluation reports it over).
        allowances = {k: Allowance(share_w=m.minimum_w, growth_w=0, limit_w=min(m.own_limit_w, m.current_w, m.minimum_w),
                                   over_share=m.current_w > m.minimum_w) for k, m in members.items()}
        return GroupResult(budget_w, allowances, feasible=False, current_w=current)
    extra = water_fill({k: 0 if m.remote else max(0, min(m.demand_w, m.own_limit_w) - m.minimum_w)
                        for k, m in members.items()}, budget_w - minimum)
    shares = {k: m.minimum_w + extra[k] for k, m in members.items()}
    # The same split had every member asked for at least what it holds: who holds more than that
    # is over its share (the group cannot afford it), not merely shrinking by its own proposal.
    held = water_fill({k: max(0, min(max(m.demand_w, m.current_w), m.own_limit_w) - m.minimum_w)
                       for k, m in members.items()}, budget_w - minimum)
    # what each may grow to: its share, or for a remote member its demand (its growth comes out of
    # the free watts only, so it never lowers a holder's share)
    ceiling = {k: min(m.own_limit_w, m.demand_w if m.remote else shares[k]) for k, m in members.items()}
    growth = water_fill({k: max(0, ceiling[k] - m.current_w) for k, m in members.items()}, budget_w - current)
    allowances = {
        k: Allowance(share_w=shares[k], growth_w=growth[k], limit_w=min(ceiling[k], m.current_w + growth[k]),
                     over_share=m.current_w > m.minimum_w + held[k])
        for k, m in members.items()
    }
    return GroupResult(budget_w, allowances, feasible=True, current_w=current)


UNMANAGED = "(unmanaged)"  # the member that stands for every GPU pod on a group no listed deployment owns


def unmanaged_member(watts: int) -> Member:
    """Pods no listed deployment owns draw what they draw: their whole charge is fixed (granted
    first, never grown or shrunk), so it only lowers what the listed deployments may grow into."""
    return Member(minimum_w=watts, demand_w=watts, current_w=watts, own_limit_w=watts)


@dataclass(frozen=True)
class Footprint:
    """One deployment across the groups it may land on (watts). ``minimum_w``, ``demand_w``,
    ``current_w`` and ``own_limit_w`` are the whole deployment's (``current_w``: what its
    evaluation charges, unplaced replicas and pods off every group included)."""

    minimum_w: int
    demand_w: int
    current_w: int
    own_limit_w: int
    placed_w: Mapping[str, int]  # group -> what its pods on that group's nodes are charged
    unplaced_w: int = 0  # charged replicas without a node yet (not created, or Pending unscheduled)

    def on(self, group: str) -> int:
        """What it may hold on ``group`` at its current counts: its pods there plus every unplaced replica."""
        return self.placed_w.get(group, 0) + self.unplaced_w

    def member_on(self, group: str) -> Member:
        """Its figures on one group: current = its footprint there; a growth (demand above current,
        up to its own limit) may land wholly there; its minimum footprint there is at most what it
        holds there now plus what it lacks of its minimum (shrinking adds no pod there). On a group
        where it holds no pod while it holds some elsewhere it is ``remote``: there only because a new
        pod may land there."""
        here = self.on(group)
        minimum = min(self.minimum_w, here + max(0, self.minimum_w - self.current_w))
        change = min(self.demand_w, self.own_limit_w) - self.current_w
        return Member(minimum_w=minimum, demand_w=max(minimum, here + change), current_w=here,
                      own_limit_w=max(0, here + self.own_limit_w - self.current_w),
                      remote=not self.placed_w.get(group) and any(self.placed_w.values()))


@dataclass(frozen=True)
class RackPlan:
    limits: dict[str, int]  # deployment -> the (whole-deployment) limit its planner uses
    projected_w: dict[str, int]  # group -> the ledger: fixed watts + every footprint on it
    peak_w: dict[str, int]  # group -> its bound through the transitions: each member's growth landing there
    over_share: frozenset[str] = frozenset()  # deployments over their fair share on some group (Allowance)


def allocate_racks(budgets: Mapping[str, int], footprints: Mapping[str, Footprint],
                   groups: Mapping[str, Collection[str]], fixed_w: Mapping[str, int] | None = None) -> RackPlan:
    """Planning limits for deployments spread over groups. ``groups``: deployment -> the groups it
    may land on; ``fixed_w``: group -> watts no listed deployment owns (``unmanaged_member``). A
    deployment on no budgeted group gets no limit (absent from ``limits``)."""
    fixed_w = fixed_w or {}
    changes: dict[str, list[int]] = {k: [] for k in footprints}
    over: dict[str, list[int]] = {k: [] for k in footprints}  # its limits on the groups it is over its share on
    projected: dict[str, int] = {}
    overrun: set[str] = set()
    for group, budget_w in budgets.items():
        on = {k: f.member_on(group) for k, f in footprints.items() if group in groups.get(k, ())}
        tenants = fixed_w.get(group, 0)
        projected[group] = tenants + sum(m.current_w for m in on.values())
        if not on:
            continue
        result = allocate(budget_w, {**on, UNMANAGED: unmanaged_member(tenants)} if tenants else on)
        for k, m in on.items():
            changes[k].append(result.allowances[k].limit_w - m.current_w)
            if result.allowances[k].limit_w < m.current_w:
                over[k].append(result.allowances[k].limit_w)
            if result.allowances[k].over_share:
                overrun.add(k)
    # Over its share on a group: the operator, not powerfleet, picks which pods go, and it may keep every
    # one on that group, so what it keeps in all must fit its limit there (a shrink landing elsewhere
    # would leave the group over): ``min(over[k])`` besides its smallest change.
    limits = {k: min(footprints[k].own_limit_w, footprints[k].current_w + min(c), *over[k])
              for k, c in changes.items() if c}
    peak = {g: w + sum(max(0, limits[k] - footprints[k].current_w) for k in limits if g in groups.get(k, ()))
            for g, w in projected.items()}
    return RackPlan(limits, projected, peak, frozenset(overrun))
