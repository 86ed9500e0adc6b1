"""A group's nodes and the priority of the pods on them, from the cluster, kept for a while.

The guard runs every period (1 s by default); listing nodes and pods that often would load the
API server for figures that change at the pace of scheduling. ``ClusterTopology`` lists them
at most once per ``refresh_s`` per group (a node's group is its ``budget.group_label`` value,
as for the budget ledger; a pod's priority is its deployment's ``budget.deployments.<key>.priority``,
the deployment named by the pod's Dynamo label). A failed LIST keeps the last view.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from powerfleet.clock import Clock
from powerfleet.cluster.dgd import LABEL_DGD_NAME
from powerfleet.cluster.ports import ClusterReader
from powerfleet.power.guard import Priority
from powerfleet.power.live import GroupView

log = logging.getLogger("powerfleet.power")


def group_view(cluster: ClusterReader, group: str, group_label: str,
               priorities: Mapping[str, Priority]) -> GroupView:
    """One read: the group's nodes (with their allocatable GPUs: the inventory the guard counts even
    where no report names a GPU), then the pods on each (``priorities``: "namespace/name" -> priority)."""
    listed = cluster.list_nodes(label_selector=f"{group_label}={group}")
    nodes = frozenset(n.name for n in listed)
    prio: dict[str, Priority] = {}
    for node in sorted(nodes):
        for p in cluster.list_pods(None, node_name=node):
            dgd = p.labels.get(LABEL_DGD_NAME)
            if p.uid and dgd is not None and f"{p.namespace}/{dgd}" in priorities:
                prio[p.uid] = priorities[f"{p.namespace}/{dgd}"]
    return GroupView(nodes=nodes, priority=prio,
                     gpus={n.name: n.gpu_allocatable for n in listed if n.gpu_allocatable is not None})


class ClusterTopology:
    def __init__(self, cluster: ClusterReader, group_label: str, priorities: Mapping[str, Priority],
                 refresh_s: float, clock: Clock) -> None:
        self._cluster = cluster
        self._label = group_label
        self._priorities = dict(priorities)
        self._refresh_s = refresh_s
        self._clock = clock
        self._views: dict[str, tuple[float, GroupView]] = {}

    def view(self, group: str) -> GroupView:
        now = self._clock.monotonic()
        held = self._views.get(group)
        if held is not None and now - held[0] < self._refresh_s:
            return held[1]
        try:
            view = group_view(self._cluster, group, self._label, self._priorities)
        except Exception as exc:  # the API server is down: the last view is the best there is
            if held is None:
                raise
            log.warning("group %s: cannot list its nodes and pods (%s); keeping the view of %.0fs ago",
                        group, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, now - held[0])
            self._views[group] = (now, held[1])  # retried after refresh_s, not every period
            return held[1]
        self._views[group] = (now, view)
        return view
