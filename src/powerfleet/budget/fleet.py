"""The fleet-wide part of a budget tick (pure): which group each deployment draws from, and the
planning limit each gets from its groups' budgets (``groups.allocate``).

A deployment belongs to every budgeted group that holds one of its live pods, and to the group
its DGD names with the group label; its whole projection is charged to each (conservative: new
pods may land on any of them). One that has no placed pod and names no group while group
budgets exist gets no allowance: its scale-ups are blocked until its pods are placed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from powerfleet.budget.groups import Member, allocate
from powerfleet.budget.ledger import role_counts
from powerfleet.budget.program import DeploymentBudget, GroupLimit
from powerfleet.cluster.dgd import DGD, LABEL_DGD_NAME
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.immutability import AdmittedPowerInputs, check_power_inputs_unchanged
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.power import PowerConfig, resolve_power_config
from powerfleet.cluster.settlement import partition_pods

UNPLACED = "(unplaced)"


@dataclass(frozen=True)
class DeploymentView:
    key: str  # namespace/name
    dgd: DGD
    admitted: AdmittedPowerInputs | None
    budget: DeploymentBudget
    proposal: Mapping[str, int] | None
    pods: Sequence[PodInfo]  # this deployment's pods (others are ignored)
    claim_classes: Mapping[str, tuple[str, ...]] | None = None  # its namespace's ResourceClaimTemplates (DRA)

    def resolved(self) -> PowerConfig | DGDInputError:
        try:
            return resolve_power_config(self.dgd, self.claim_classes)
        except DGDInputError as exc:
            return exc


def _power(view: DeploymentView) -> PowerConfig | None:
    if view.admitted is not None:
        return view.admitted.power
    got = view.resolved()
    return None if isinstance(got, DGDInputError) else got


def member(view: DeploymentView, power: PowerConfig) -> Member:
    """Minimum, demand and current watts; current charges what holds GPUs (budget/ledger.py): the
    max of desired, ready, updated and existing-pod replicas, surge and Terminating pods included."""
    by_comp = partition_pods(view.dgd, view.pods)
    # A deployment failing closed (inputs drifted since admission) cannot scale: its proposal
    # claims no share of the group.
    frozen = view.admitted is not None and bool(check_power_inputs_unchanged(view.admitted, view.dgd,
                                                                              resolved=view.resolved()))
    minimum = demand = current = 0
    for role, rp in power.roles.items():
        charged = role_counts(view.dgd, rp, by_comp.get(rp.component, [])).charged
        w = rp.watts_per_replica
        minimum += view.budget.min_replicas.get(role.value, 1) * w
        proposed = None if frozen else (view.proposal or {}).get(role.value)
        demand += (charged if proposed is None else proposed) * w
        current += charged * w
    return Member(minimum_w=minimum, demand_w=max(demand, minimum), current_w=current,
                  own_limit_w=view.budget.power_limit_w)


def groups_of(view: DeploymentView, node_groups: Mapping[str, str], budgets: Mapping[str, int],
              group_label: str) -> set[str]:
    own = [p for p in view.pods if p.namespace == view.dgd.namespace and p.labels.get(LABEL_DGD_NAME) == view.dgd.name]
    out = {node_groups[p.node_name] for p in own
           if p.node_name in node_groups and p.is_running_or_starting and node_groups[p.node_name] in budgets}
    pinned = view.dgd.labels.get(group_label)
    if pinned in budgets:
        out.add(pinned)
    if not out and budgets and not any(p.node_name for p in own):
        out.add(UNPLACED)
    return out


UNMANAGED = "(unmanaged)"  # the member that stands for every GPU pod on a group no listed deployment owns


def unmanaged_member(watts: int) -> Member:
    """Pods no listed deployment owns draw what they draw: their whole charge is fixed (granted
    first, never grown or shrunk), so it only lowers what the listed deployments may grow into."""
    return Member(minimum_w=watts, demand_w=watts, current_w=watts, own_limit_w=watts)


def group_limits(views: Sequence[DeploymentView], node_groups: Mapping[str, str], budgets: Mapping[str, int],
                 group_label: str, unmanaged_w: Mapping[str, int] | None = None) -> dict[str, GroupLimit]:
    """The GroupLimit of every deployment (``GroupLimit(None, None)`` when it is on no budgeted group).
    ``unmanaged_w``: group -> the ledger's charge for the GPU pods on it that no listed deployment owns."""
    members: dict[str, Member] = {}
    touched: dict[str, set[str]] = {}
    for view in views:
        power = _power(view)
        if power is None:
            continue
        members[view.key] = member(view, power)
        touched[view.key] = groups_of(view, node_groups, budgets, group_label)
    limits: dict[str, list[int | None]] = {k: [] for k in members}
    for group, budget_w in budgets.items():
        on = {k: members[k] for k, gs in touched.items() if group in gs}
        if not on:
            continue
        tenants = (unmanaged_w or {}).get(group, 0)
        result = allocate(budget_w, {**on, UNMANAGED: unmanaged_member(tenants)} if tenants else on)
        for k, a in result.allowances.items():
            if k in limits:
                limits[k].append(a.limit_w)
    out: dict[str, GroupLimit] = {}
    for view in views:
        k = view.key
        if k not in members or not touched[k]:
            out[k] = GroupLimit(group=None, limit_w=None)
            continue
        m = members[k]
        names = ",".join(sorted(touched[k]))
        if UNPLACED in touched[k]:
            out[k] = GroupLimit(group=names, limit_w=None, minimum_w=m.minimum_w, current_w=m.current_w)
            continue
        vals = [v for v in limits[k] if v is not None]
        out[k] = GroupLimit(group=names, limit_w=min(vals) if vals else None, minimum_w=m.minimum_w,
                            current_w=m.current_w)
    return out
