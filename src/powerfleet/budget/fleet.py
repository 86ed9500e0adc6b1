"""The fleet-wide part of a budget tick (pure): which groups each deployment may land on, what
it physically holds on each, and the planning limit each gets from its groups' budgets
(``groups.allocate_racks``).

A deployment belongs to every budgeted group that holds one of its live pods, to the group its
DGD names with the group label, and, while a replica of it holds no node, to every group with a
node that replica may be scheduled on (``reachable_groups``; also for a deployment whose pods are
all Pending, which gets no allowance itself but is charged, like a Pending tenant, where they may bind). A group is charged what the deployment's pods on its nodes
are charged (Terminating and surge pods included, on the evaluation's evidence basis) plus every
charged replica of it that holds no node yet (the scheduler may put it on any of its groups). One
that has no placed pod and names no group while group budgets exist gets no allowance: its
scale-ups are blocked until its pods are placed. One whose live pods are all on nodes in no
budgeted group, and whose new pods may be scheduled on a budgeted group's node, gets no allowance
either (``UNGROUPED``): its scale-ups wait, with that reason, until its pods are on a group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from powerfleet.budget.evidence import Evidence, role_charge
from powerfleet.budget.groups import UNMANAGED, Footprint, Member, allocate_racks, unmanaged_member
from powerfleet.budget.ledger import role_counts
from powerfleet.budget.program import DeploymentBudget, GroupLimit
from powerfleet.cluster.dgd import DGD, LABEL_DGD_NAME
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.immutability import AdmittedPowerInputs, check_power_inputs_unchanged
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.placement import ANYWHERE, Placement
from powerfleet.cluster.power import PowerConfig, resolve_power_config
from powerfleet.cluster.settlement import partition_pods

UNPLACED = "(unplaced)"
UNGROUPED = "(pods on nodes in no group)"  # its new replicas may land on a budgeted group: scale-ups wait


@dataclass(frozen=True)
class DeploymentView:
    key: str  # namespace/name
    dgd: DGD
    admitted: AdmittedPowerInputs | None
    budget: DeploymentBudget
    proposal: Mapping[str, int] | None
    pods: Sequence[PodInfo]  # this deployment's pods (others are ignored)
    claim_classes: Mapping[str, tuple[str, ...]] | None = None  # its namespace's ResourceClaimTemplates (DRA)
    evidence: Evidence | None = None  # the agents' enforcement reports (None: the requested caps)

    def resolved(self) -> PowerConfig | DGDInputError:
        try:
            return resolve_power_config(self.dgd, self.claim_classes)
        except DGDInputError as exc:
            return exc


def power_of(view: DeploymentView) -> PowerConfig | None:
    if view.admitted is not None:
        return view.admitted.power
    got = view.resolved()
    return None if isinstance(got, DGDInputError) else got


def live_proposal(view: DeploymentView) -> Mapping[str, int]:
    """Its proposal, or none for a deployment failing closed (inputs drifted since admission): it
    cannot scale, so its proposal claims no share of a group (watts or GPUs)."""
    frozen = view.admitted is not None and bool(check_power_inputs_unchanged(view.admitted, view.dgd,
                                                                              resolved=view.resolved()))
    return {} if frozen else (view.proposal or {})


def member(view: DeploymentView, power: PowerConfig) -> Member:
    """Minimum, demand and current watts; current charges what holds GPUs (budget/ledger.py): the
    max of desired, ready, updated and existing-pod replicas, surge and Terminating pods included,
    plus what its pods cost beyond their caps (budget/evidence.py: stale GPUs at their maximum
    settable limit), the same charge its evaluation plans with."""
    by_comp = partition_pods(view.dgd, view.pods)
    proposal = live_proposal(view)
    minimum = demand = current = 0
    for role, rp in power.roles.items():
        charged = role_counts(view.dgd, rp, by_comp.get(rp.component, [])).charged
        surplus = role_charge(by_comp.get(rp.component, []), view.evidence, rp.cap.watts, rp.gpus_per_pod).surplus_w
        demand += surplus
        current += surplus
        w = rp.watts_per_replica
        minimum += view.budget.min_replicas.get(role.value, 1) * w
        proposed = proposal.get(role.value)
        demand += (charged if proposed is None else proposed) * w
        current += charged * w
    return Member(minimum_w=minimum, demand_w=max(demand, minimum), current_w=current,
                  own_limit_w=view.budget.power_limit_w)


def groups_of(view: DeploymentView, node_groups: Mapping[str, str], budgets: Mapping[str, int],
              group_label: str, node_labels: Mapping[str, Mapping[str, str]] | None = None,
              admitted: dict[str, set[str]] | None = None) -> set[str]:
    """The budgeted groups holding one of its live pods, the one its label names, and (given
    ``node_labels``) every one with a node its replicas without a node may be scheduled on
    (``admitted``: the groups each placement admits, kept across the deployments of one tick)."""
    own = [p for p in view.pods if p.namespace == view.dgd.namespace and p.labels.get(LABEL_DGD_NAME) == view.dgd.name]
    out = {node_groups[p.node_name] for p in own
           if p.node_name in node_groups and p.is_running_or_starting and node_groups[p.node_name] in budgets}
    pinned = view.dgd.labels.get(group_label)
    if pinned in budgets:
        out.add(pinned)
    if not out and budgets and not any(p.node_name for p in own):
        out.add(UNPLACED)  # no allowance (its scale-ups wait), but its Pending pods are charged where they may bind
        if node_labels is not None:
            out |= reachable_groups(view, node_groups, budgets, node_labels, admitted)
    elif not out and budgets and _may_reach_a_group(own, node_groups, budgets, node_labels):
        out.add(UNGROUPED)  # its pods are on nodes in no group, its new ones may land on one: scale-ups wait
    elif node_labels is not None:
        out |= reachable_groups(view, node_groups, budgets, node_labels, admitted)
    return out


def _may_reach_a_group(own: Sequence[PodInfo], node_groups: Mapping[str, str], budgets: Mapping[str, int],
                       node_labels: Mapping[str, Mapping[str, str]] | None) -> bool:
    """Whether a new pod like its live ones may be scheduled on a budgeted group's node (without the
    nodes' labels, or a pod's placement not read: it may)."""
    live = [p for p in own if p.is_running_or_starting]
    if node_labels is None or any(getattr(p, "placement", None) is None for p in live):
        return bool(live)
    return any(p.placement.admits(n, node_labels.get(n, {}))  # type: ignore[attr-defined]
               for p in live for n, g in node_groups.items() if g in budgets)


def reachable_groups(view: DeploymentView, node_groups: Mapping[str, str], budgets: Mapping[str, int],
                     node_labels: Mapping[str, Mapping[str, str]], admitted: dict[str, set[str]] | None = None
                     ) -> set[str]:
    """The budgeted groups with a node that a role's replica holding no node yet, or one its
    proposal adds, may be scheduled on (its pods' nodeSelector and required node affinity,
    cluster/placement.py): the scheduler, not the racks it is on now, decides where it lands, so a
    scale-up is shared by every group it may land on. A role none of whose pods carries its
    constraints (not read, or no pod created yet) adds none."""
    power = power_of(view)
    if power is None:
        return set()
    by_comp = partition_pods(view.dgd, view.pods)
    proposal = live_proposal(view)
    out: set[str] = set()
    for role, rp in power.roles.items():
        pods = by_comp.get(rp.component, [])
        charged = role_counts(view.dgd, rp, pods).charged
        growing = proposal.get(role.value, 0) > charged
        if not growing and charged * rp.node_count <= sum(1 for p in pods if p.is_running_or_starting and p.node_name):
            continue  # every charged replica holds a node, and none is to be added
        placements: list[Placement] = []
        for p in pods:  # the pods of one template: mostly one placement
            if (pl := getattr(p, "placement", None)) is not None and pl not in placements:
                placements.append(pl)
        if ANYWHERE in placements:  # no constraint (the common case): every budgeted group with a node
            out |= {g for g in node_groups.values() if g in budgets}
            continue
        for pl in placements:
            out |= _admitted_by(pl, node_groups, budgets, node_labels, {} if admitted is None else admitted)
    return out


def _admitted_by(pl: Placement, node_groups: Mapping[str, str], budgets: Mapping[str, int],
                 node_labels: Mapping[str, Mapping[str, str]], admitted: dict[str, set[str]]) -> set[str]:
    """The budgeted groups with a node ``pl`` admits, computed once per distinct placement (the pods
    of a template share one: 1,000 deployments on 1,000 nodes made 2.5 million node checks a tick)."""
    key = pl.model_dump_json()
    if key not in admitted:
        admitted[key] = {g for n, g in node_groups.items() if g in budgets and pl.admits(n, node_labels.get(n, {}))}
    return admitted[key]


def footprint(view: DeploymentView, power: PowerConfig, node_groups: Mapping[str, str]) -> Footprint:
    """The deployment's whole ``member`` figures, and where its charge physically is: per group,
    its pods on the group's nodes (a pod counts while it holds GPUs, Terminating included; its
    evidence surplus with it); unplaced, the charged pods no node holds yet."""
    m = member(view, power)
    by_comp = partition_pods(view.dgd, view.pods)
    placed: dict[str, int] = defaultdict(int)
    unplaced = 0
    for rp in power.roles.values():
        pods = by_comp.get(rp.component, [])
        per_pod = rp.cap.watts * rp.gpus_per_pod
        on_node = [p for p in pods if p.is_running_or_starting and p.node_name]
        charged = role_counts(view.dgd, rp, pods).charged
        unplaced += max(0, charged * rp.node_count - len(on_node)) * per_pod
        by_group: dict[str, list[PodInfo]] = defaultdict(list)
        for p in on_node:
            if (g := node_groups.get(p.node_name or "")) is not None:
                by_group[g].append(p)
        for g, ps in by_group.items():
            placed[g] += len(ps) * per_pod + role_charge(ps, view.evidence, rp.cap.watts, rp.gpus_per_pod).surplus_w
    return Footprint(minimum_w=m.minimum_w, demand_w=m.demand_w, current_w=m.current_w, own_limit_w=m.own_limit_w,
                     placed_w=dict(placed), unplaced_w=unplaced)


@dataclass(frozen=True)
class FleetLedger:
    limits: dict[str, GroupLimit]  # deployment -> its GroupLimit
    projected_w: dict[str, int] = field(default_factory=dict)  # group -> the ledger (tenants included)
    peak_w: dict[str, int] = field(default_factory=dict)  # group -> bound through the transitions
    groups: dict[str, set[str]] = field(default_factory=dict)  # deployment -> the groups it may land on (groups_of)


def fleet_ledger(views: Sequence[DeploymentView], node_groups: Mapping[str, str], budgets: Mapping[str, int],
                 group_label: str, unmanaged_w: Mapping[str, int] | None = None,
                 node_labels: Mapping[str, Mapping[str, str]] | None = None) -> FleetLedger:
    """Every deployment's GroupLimit (``GroupLimit(None, None)`` when it is on no budgeted group)
    and every group's projected watts and transition bound. ``unmanaged_w``: group -> the
    ledger's charge for the GPU pods on it that no listed deployment owns. ``node_labels``: node ->
    its labels, so a replica without a node is charged to every group it may be scheduled on."""
    prints: dict[str, Footprint] = {}
    touched: dict[str, set[str]] = {}
    admitted: dict[str, set[str]] = {}
    for view in views:
        power = power_of(view)
        if power is None:
            continue
        prints[view.key] = footprint(view, power, node_groups)
        touched[view.key] = groups_of(view, node_groups, budgets, group_label, node_labels, admitted)
        if UNPLACED in touched[view.key]:  # it cannot grow: charged what it holds, like a Pending tenant
            f = prints[view.key]
            prints[view.key] = replace(f, demand_w=max(f.current_w, f.minimum_w))
    racks = allocate_racks(budgets, prints, touched, unmanaged_w)
    out: dict[str, GroupLimit] = {}
    for view in views:
        k = view.key
        if k not in prints or not touched[k]:
            out[k] = GroupLimit(group=None, limit_w=None)
            continue
        f = prints[k]
        limit = None if touched[k] & {UNPLACED, UNGROUPED} else racks.limits.get(k)
        out[k] = GroupLimit(group=",".join(sorted(touched[k])), limit_w=limit, minimum_w=f.minimum_w,
                            current_w=f.current_w, over_share=k in racks.over_share)
    return FleetLedger(out, racks.projected_w, racks.peak_w, touched)


def group_limits(views: Sequence[DeploymentView], node_groups: Mapping[str, str], budgets: Mapping[str, int],
                 group_label: str, unmanaged_w: Mapping[str, int] | None = None) -> dict[str, GroupLimit]:
    """The GroupLimit of every deployment (``fleet_ledger``'s limits)."""
    return fleet_ledger(views, node_groups, budgets, group_label, unmanaged_w).limits


__all__ = ["UNGROUPED", "UNMANAGED", "UNPLACED", "DeploymentView", "FleetLedger", "fleet_ledger", "footprint", "group_limits",
           "groups_of", "live_proposal", "member", "power_of", "reachable_groups", "unmanaged_member"]
