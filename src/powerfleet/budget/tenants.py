"""What a rack is charged for the GPU pods no listed deployment plans (pure): other tenants, unlisted
DGDs, and the pods of a listed DGD whose power inputs do not resolve (docs/budget.md "Tenants").

- A pod on a budgeted group's node is charged there (``evidence.pod_charge``: the larger of its
  annotation's cap and its GPUs' fresh enforced limits, else its cap, else the maximum settable
  limit per GPU).
- A pod of a listed DGD whose power inputs do not resolve (a cap typo, GPU components typed ``main``
  or ``default``) is charged at the maximum settable limit of every GPU it holds, whatever its
  annotation says: nothing about its caps can be trusted, and its deployment is never invisible.
- A pod that holds no node yet (Pending, unscheduled) and is not terminal is charged, in watts and
  GPUs, to every budgeted group with a node its nodeSelector and required node affinity admit
  (cluster/placement.py; what is not understood admits): the scheduler may bind it to any of them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from powerfleet.budget.evidence import Charge, pod_charge
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.errors import PowerInputError
from powerfleet.cluster.gpu_pods import GpuPod
from powerfleet.cluster.placement import ANYWHERE
from powerfleet.cluster.power import parse_power_annotation

UNRESOLVED = "unresolved_inputs"  # the basis of a pod of a listed DGD whose power inputs do not resolve
UNPLACED_BASIS = "unplaced"  # the basis of a pod that holds no node yet


def _cap(pod: GpuPod) -> int | None:
    raw = pod.annotations.get(POWER_ANNOTATION)
    if raw is None:
        return None
    try:
        return parse_power_annotation(raw).watts
    except PowerInputError:
        return None  # an unreadable cap is no cap: charged as unenforced


@dataclass
class Tenants:
    watts: dict[str, int] = field(default_factory=dict)  # group -> watts of the pods no listed deployment plans
    basis: dict[str, dict[str, int]] = field(default_factory=dict)  # group -> basis -> watts
    unplaced_gpus: dict[str, int] = field(default_factory=dict)  # group -> GPUs of such pods holding no node
    unresolved_w: dict[str, int] = field(default_factory=dict)  # listed DGD key -> watts its pods are charged


def admitting_groups(pod: GpuPod, group_nodes: Mapping[str, Sequence[str]],
                     node_labels: Mapping[str, Mapping[str, str]]) -> set[str]:
    """The budgeted groups with a node ``pod`` may be scheduled on."""
    pl = pod.placement or ANYWHERE
    return {g for g, ns in group_nodes.items() if any(pl.admits(n, node_labels.get(n, {})) for n in ns)}


def tenant_charges(pods: Sequence[GpuPod], owned: Collection[str], node_groups: Mapping[str, str],
                   budgets: Mapping[str, int], reports: Mapping[str, Any], now: float, fresh_s: float,
                   max_settable_w: int, *, unresolved: Mapping[str, str] | None = None,
                   node_labels: Mapping[str, Mapping[str, str]] | None = None) -> Tenants:
    """``owned``: UIDs of the pods a listed deployment's ledger charges; ``unresolved``: pod UID ->
    the key of the listed DGD whose power inputs do not resolve; ``node_labels``: node -> labels
    (None: pods holding no node are not charged, as without a pod's placement)."""
    unresolved = unresolved or {}
    out = Tenants()
    watts: dict[str, int] = defaultdict(int)
    basis: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    gpus: dict[str, int] = defaultdict(int)
    group_nodes: dict[str, list[str]] = defaultdict(list)
    for n, g in node_groups.items():
        if g in budgets:
            group_nodes[g].append(n)
    for p in pods:
        if p.gpus <= 0 or not p.is_running_or_starting or p.uid in owned:
            continue
        if p.node_name:
            group = node_groups.get(p.node_name)
            targets = {group} if group in budgets else set()
        elif node_labels is not None:
            targets = admitting_groups(p, group_nodes, node_labels)
        else:
            continue
        key = unresolved.get(p.uid)
        if key is not None:
            charge = Charge(max_settable_w * p.gpus, UNRESOLVED)
            out.unresolved_w[key] = out.unresolved_w.get(key, 0) + charge.watts
        else:
            charge = pod_charge(p.uid, p.gpus, _cap(p), reports, p.node_name, now, fresh_s, max_settable_w)
        for g in targets:
            watts[g] += charge.watts
            basis[g][charge.basis if p.node_name else UNPLACED_BASIS] += charge.watts
            if not p.node_name:
                gpus[g] += p.gpus
    out.watts, out.unplaced_gpus = dict(watts), dict(gpus)
    out.basis = {g: dict(b) for g, b in basis.items()}
    return out
