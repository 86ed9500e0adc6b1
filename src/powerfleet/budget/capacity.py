"""The GPU-capacity ceiling of a budget tick (pure): no deployment is planned more replicas than
the GPUs of the groups it may land on can hold (docs/budget.md "GPU capacity").

Watts may fit where GPUs do not exist: a replica the scheduler cannot place stays Pending, and
its deployment never settles. So each tick, per budgeted group:

- a node's free GPUs = its allocatable ``nvidia.com/gpu`` - the GPUs requested by every pod on it
  that holds them (any owner, Pending-but-bound and Terminating included; Succeeded/Failed not);
  usable by a deployment only in whole pods (``free // GPUs per pod``, its smallest pod);
- the group's room = its free GPUs - the GPUs of every listed deployment's replicas and every other
  tenant's pod that hold no node yet and may land there (a not yet created or unscheduled pod will
  take free GPUs first);
- the room is shared max-min fair among the deployments that want to grow there (their wanted
  GPUs beyond what they hold: the same water-fill as the watts, budget/groups.py);
- a deployment may then hold what it is charged now plus what its groups grant it (a grant on
  any of its groups: the scheduler puts a pod where GPUs are free). Its planner stops scale-ups
  there and never shrinks for it (planner.py ``_capacity``).

A group with a node that reports no GPU allocatable is unknown: a deployment that may land on it
gets no ceiling (as before). So does one on no budgeted group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from powerfleet.budget.fleet import DeploymentView, live_proposal, power_of
from powerfleet.budget.groups import water_fill
from powerfleet.budget.ledger import role_counts
from powerfleet.cluster.gpu_pods import GpuPod
from powerfleet.cluster.settlement import partition_pods


@dataclass(frozen=True)
class GpuNeed:
    """One deployment's GPUs as the ceiling sees them."""

    charged: int  # GPUs of its charged replicas (budget/ledger.py)
    unplaced: int  # of those, the GPUs of replicas that hold no node yet
    wanted: int  # GPUs at its proposal (unproposed roles at their charge)
    pod_gpus: int  # its smallest pod's GPUs (a node's free GPUs count in whole pods of it)


def need_of(view: DeploymentView) -> GpuNeed | None:
    power = power_of(view)
    if power is None:
        return None
    by_comp = partition_pods(view.dgd, view.pods)
    proposal = live_proposal(view)
    charged = unplaced = wanted = 0
    sizes = []
    for role, rp in power.roles.items():
        pods = by_comp.get(rp.component, [])
        count = role_counts(view.dgd, rp, pods).charged
        per_replica = rp.gpus_per_pod * rp.node_count
        on_node = sum(1 for p in pods if p.is_running_or_starting and p.node_name)
        charged += count * per_replica
        unplaced += max(0, count * rp.node_count - on_node) * rp.gpus_per_pod
        minimum = view.budget.min_replicas.get(role.value, 1)
        target = proposal.get(role.value)
        wanted += (count if target is None else max(target, minimum)) * per_replica
        if rp.gpus_per_pod > 0:
            sizes.append(rp.gpus_per_pod)
    return GpuNeed(charged, unplaced, wanted, min(sizes, default=1))


def free_gpus(node_gpus: Mapping[str, int | None], pods: Sequence[GpuPod]) -> dict[str, int | None]:
    """node -> allocatable GPUs minus those its pods request (None: the node reports none)."""
    used: dict[str, int] = defaultdict(int)
    for p in pods:
        if p.node_name and p.is_running_or_starting:
            used[p.node_name] += p.gpus
    return {n: None if a is None else max(0, a - used[n]) for n, a in node_gpus.items()}


def gpu_ceilings(needs: Mapping[str, GpuNeed], groups: Mapping[str, Collection[str]],
                 group_nodes: Mapping[str, Sequence[str]], free: Mapping[str, int | None],
                 tenants_unplaced: Mapping[str, int] | None = None) -> dict[str, int]:
    """deployment -> the GPUs it may hold (absent: no ceiling). ``groups``: deployment -> the
    budgeted groups it may land on; ``group_nodes``: group -> its nodes; ``free``: node -> free GPUs;
    ``tenants_unplaced``: group -> GPUs of other tenants' pods holding no node that may land there."""
    tenants_unplaced = tenants_unplaced or {}
    known = {g for g, ns in group_nodes.items() if all(free.get(n) is not None for n in ns)}
    on: dict[str, list[str]] = defaultdict(list)
    for k, gs in groups.items():
        if k in needs:
            for g in gs:
                on[g].append(k)
    grants: dict[str, int] = defaultdict(int)
    for g in sorted(known):
        members = on.get(g, [])
        if not members:
            continue
        pending = sum(needs[k].unplaced for k in members) + tenants_unplaced.get(g, 0)
        room = sum(free[n] or 0 for n in group_nodes[g]) - pending
        want = {k: max(0, needs[k].wanted - needs[k].charged) for k in members}
        for k, got in water_fill(want, room).items():
            # in whole pods of its size: a node's last free GPU cannot hold a 2-GPU pod
            usable = sum((free[n] or 0) // needs[k].pod_gpus * needs[k].pod_gpus for n in group_nodes[g]) - pending
            grants[k] += max(0, min(got, usable))
    return {k: needs[k].charged + min(grants[k], max(0, needs[k].wanted - needs[k].charged))
            for k, gs in groups.items() if k in needs and gs and all(g in known for g in gs)}
