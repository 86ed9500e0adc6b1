"""The fleet-wide read of one budget tick: group allowances for every configured deployment from
one LIST each of nodes, DGDs and pods, plus the agents' enforcement reports (issue 18 item 2).

A rack is charged for every GPU pod on its nodes, listed or not. A pod of a listed deployment is
charged through that deployment's ledger (budget/ledger.py); every other GPU pod on a budgeted
group's node (another tenant, an unlisted DGD) is charged at its power annotation's cap where it
has one, else at the enforced limits its node's agent reports for its GPUs, else at the GPUs'
maximum settable limit (budget/evidence.py). That charge is fixed: it lowers what the listed
deployments may grow into and is never itself planned.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from powerfleet.budget.evidence import AGENT_POD_LABELS, EnforcementReports, Evidence, EvidenceMode, NoReports, agent_nodes
from powerfleet.budget.capacity import free_gpus, gpu_ceilings, need_of
from powerfleet.budget.fleet import DeploymentView, fleet_ledger, power_of
from powerfleet.budget.program import DeploymentBudget, GroupLimit
from powerfleet.budget.state import BudgetState
from powerfleet.budget.tenants import tenant_charges
from powerfleet.cluster.dgd import DGD, LABEL_DGD_NAME
from powerfleet.cluster.gpu_pods import GpuPod
from powerfleet.cluster.ports import ClusterError, ClusterReader
from powerfleet.heap import paused_gc


class GpuPodReader(Protocol):
    def list_gpu_pods(self) -> list[GpuPod]: ...


def ledger_reads(pod: GpuPod) -> bool:
    """Whether a tick reads this pod at all: it holds GPUs (the ledger, free GPUs), belongs to a
    DGD (its replicas) or is a node agent (``agent_nodes``). The watch-backed pod view keeps only
    these (cluster/gpu_pod_cache.py); every other pod changes no figure of a tick."""
    return pod.gpus > 0 or LABEL_DGD_NAME in pod.labels or all(
        pod.labels.get(k) == v for k, v in AGENT_POD_LABELS.items())


class ClaimTemplates(Protocol):
    def list_claim_templates(self, namespace: str) -> dict[str, tuple[str, ...]]: ...


class Oversubscription(Protocol):
    """power.admission.AdmissionRule: group -> watts to share, given the budgets and today's charge."""

    def capacities(self, budgets: Mapping[str, int], charged: Mapping[str, int], now: float
                   ) -> tuple[dict[str, int], dict[str, Any]]: ...


def _claim_classes(dra: ClaimTemplates | None, dgds: Sequence[DGD]) -> dict[str, dict[str, tuple[str, ...]]]:
    """namespace -> its ResourceClaimTemplates' device classes, read only where a DGD claims DRA devices."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for ns in sorted({d.namespace for d in dgds if any(c.gpu_claims for c in d.components)}):
        try:
            out[ns] = dra.list_claim_templates(ns) if dra is not None else {}
        except ClusterError:
            continue  # unread: a claim then counts as one that may allocate GPUs
    return out


@dataclass
class TickPlan:
    limits: dict[str, GroupLimit]
    group_current: dict[str, int]  # the ledger: every pod on the group's nodes, plus replicas not placed yet
    skipped: dict[str, str]  # deployment -> why it is not evaluated
    group_peak_bound: dict[str, int] = field(default_factory=dict)  # projected + every member's growth landing here
    group_unmanaged: dict[str, int] = field(default_factory=dict)  # watts of GPU pods no listed deployment owns
    group_basis: dict[str, dict[str, int]] = field(default_factory=dict)  # unmanaged watts by charge basis
    group_measured: dict[str, float] = field(default_factory=dict)  # agent-reported draw (groups with reports)
    group_admission: dict[str, Any] = field(default_factory=dict)  # oversubscribed group -> power.admission.GroupCapacity
    unresolved_w: dict[str, int] = field(default_factory=dict)  # listed DGD whose inputs do not resolve -> its charge


def budget_of(cfg: Any) -> DeploymentBudget:
    return DeploymentBudget(power_limit_w=cfg.power_limit_w, max_gpus=cfg.max_gpus, min_gpus=cfg.min_gpus,
                            min_replicas=dict(cfg.min_replicas), sole_writer=cfg.sole_writer)


def _with_capacity(limits: Mapping[str, GroupLimit], views: Sequence[DeploymentView],
                   touched: Mapping[str, set[str]], group_nodes: Mapping[str, Sequence[str]],
                   node_gpus: Mapping[str, int | None], pods: Sequence[GpuPod],
                   unplaced: Mapping[str, int] | None = None) -> dict[str, GroupLimit]:
    """Each deployment's GroupLimit with the GPUs it may hold on its groups (budget/capacity.py).
    ``touched``: deployment -> the groups it may land on (the ledger's); ``unplaced``: group -> the
    GPUs of other tenants' pods holding no node that may land there."""
    needs = {v.key: n for v in views if (n := need_of(v)) is not None}
    ceilings = gpu_ceilings(needs, touched, group_nodes, free_gpus(node_gpus, pods), unplaced)
    return {k: replace(gl, gpu_capacity=ceilings.get(k)) for k, gl in limits.items()}


def _with_admission(limits: Mapping[str, GroupLimit], touched: Mapping[str, set[str]],
                    closed: Mapping[str, str]) -> dict[str, GroupLimit]:
    """Each deployment's GroupLimit naming the closed admission of the oversubscribed groups it may land on."""
    out = dict(limits)
    for k, gs in touched.items():
        why = [closed[g] for g in sorted(gs) if g in closed]
        if why and k in out:
            out[k] = replace(out[k], admission="; ".join(why))
    return out


@paused_gc()  # the bulk reads' objects: src/powerfleet/heap.py
def tick_limits(cluster: ClusterReader, state: BudgetState, deployments: Mapping[str, Any], groups: Mapping[str, int],
                group_label: str, pods_reader: GpuPodReader | None = None, reports: EnforcementReports | None = None,
                *, now: float = 0.0, fresh_s: float = 90.0, max_settable_w: int = 1000,
                dra: ClaimTemplates | None = None, evidence_mode: EvidenceMode = "auto",
                oversubscription: Oversubscription | None = None) -> TickPlan:
    """Group allowances for every configured deployment from one LIST of nodes, DGDs and pods.
    ``pods_reader``: every pod with its GPUs (None: only the deployments' own pods are read, and
    no other tenant is charged). ``evidence_mode``: how the listed deployments' GPUs are judged
    by the same reports (budget.enforcement_evidence). ``oversubscription``: admission to the
    oversubscribed groups (power/admission.py; None: every group shares its limit)."""
    if not groups:
        return TickPlan({k: GroupLimit(None, None) for k in deployments}, {}, {})
    nodes = cluster.list_nodes()
    node_groups = {n.name: n.labels[group_label] for n in nodes if group_label in n.labels}
    dgds = {f"{d.namespace}/{d.name}": d for d in cluster.list_dgds() if isinstance(d, DGD)}
    pods: Sequence[GpuPod] = (pods_reader.list_gpu_pods() if pods_reader is not None else
                              [GpuPod(**p.model_dump()) for p in cluster.list_pods(label_selector=LABEL_DGD_NAME)])
    by_dgd: dict[tuple[str, str], list[GpuPod]] = defaultdict(list)
    for p in pods:
        if LABEL_DGD_NAME in p.labels:
            by_dgd[(p.namespace, p.labels[LABEL_DGD_NAME])].append(p)
    proposals, admitted = state.proposals(), state.all_admitted()
    classes = _claim_classes(dra, [d for k, d in dgds.items() if k in deployments])
    group_nodes: dict[str, list[str]] = defaultdict(list)
    for n, g in node_groups.items():
        if g in groups:
            group_nodes[g].append(n)
    # The budgeted nodes, and every node a listed deployment's pod runs on (its own limit charges
    # its whole charge, unenforced watts included, as its evaluation plans it).
    listed = {p.node_name for k, d in dgds.items() if k in deployments for p in by_dgd.get((d.namespace, d.name), [])
              if p.node_name}
    got = (reports or NoReports()).reports(sorted({n for ns in group_nodes.values() for n in ns} | listed),
                                           agents=agent_nodes(pods))
    evidence = None if evidence_mode == "off" else Evidence(got, now, fresh_s, max_settable_w, evidence_mode)
    views, skipped, owned, unresolved = [], {}, set(), {}
    for key, cfg in deployments.items():
        dgd = dgds.get(key)
        if dgd is None:
            skipped[key] = "not found or unreadable"
            continue
        own = by_dgd.get((dgd.namespace, dgd.name), [])
        view = DeploymentView(key=key, dgd=dgd, admitted=admitted.get(key), budget=budget_of(cfg),
                              proposal=proposals.get(key), pods=own,
                              claim_classes=classes.get(dgd.namespace), evidence=evidence)
        if power_of(view) is None:  # its inputs do not resolve: its pods are charged as tenants (budget/tenants.py)
            unresolved.update({p.uid: key for p in own})
        else:
            owned.update(p.uid for p in own)
        views.append(view)
    labels = {n.name: n.labels for n in nodes}
    charged = tenant_charges(pods, owned, node_groups, groups, got, now, fresh_s, max_settable_w,
                             unresolved=unresolved, node_labels=labels if pods_reader is not None else None)
    tenants, basis = charged.watts, charged.basis
    # Each group is charged what is physically on its nodes plus what may still land there
    # (budget/fleet.py): a deployment spread over racks is not charged whole to each.
    ledger = fleet_ledger(views, node_groups, groups, group_label, tenants, labels)
    current = {g: ledger.projected_w.get(g, tenants.get(g, 0)) for g in groups}
    admission: dict[str, Any] = {}
    if oversubscription is not None:  # an oversubscribed group shares what it admits (power/admission.py)
        shared, admission = oversubscription.capacities(groups, current, now)
        ledger = fleet_ledger(views, node_groups, shared, group_label, tenants, labels)
    limits = ledger.limits
    closed = {g: cap.admission.message for g, cap in admission.items() if not cap.admission.admitted}
    if closed:  # say why in each affected deployment's status (its limit already holds it)
        limits = _with_admission(limits, ledger.groups, closed)
    if pods_reader is not None:  # every pod's GPUs are known: bound scale-ups by the GPUs that exist
        limits = _with_capacity(limits, views, ledger.groups, group_nodes,
                                {n.name: n.gpu_allocatable for n in nodes}, pods, charged.unplaced_gpus)
    peak = {g: ledger.peak_w.get(g, tenants.get(g, 0)) for g in groups}
    measured = {g: sum(r.draw_w for n in ns for r in got.get(n, []) if now - r.at <= fresh_s)
                for g, ns in group_nodes.items() if any(got.get(n) for n in ns)}
    return TickPlan(limits, current, skipped, peak, tenants, basis, measured, admission, charged.unresolved_w)
