"""The ledger's counts for one role, read from the DGD and its pods (pure).

A role is charged for what physically holds GPUs or is about to: the largest of its desired
(spec) count, its ready and updated counts (the status fields Dynamo's CRD declares) and the
replicas its existing pods make up, surge and Terminating pods included until they are gone
(a pod in phase Succeeded or Failed holds nothing). The program (one deployment) and the fleet
view (a group's current draw) both read counts here, so they charge the same replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from powerfleet.budget.planner import charged_count
from powerfleet.cluster.dgd import DGD
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.power import RolePower


@dataclass(frozen=True)
class RoleCounts:
    desired: int
    ready: int | None  # None: no status yet (baseline 0)
    updated: int | None  # None: not reported (taken as the ready count)
    pods: int | None  # replicas the existing pods make up; None: the pods could not be read

    @property
    def charged(self) -> int:
        return charged_count(self.ready, self.desired, self.updated, self.pods)


def pod_replicas(pods: Sequence[PodInfo], node_count: int) -> int:
    """Replicas that ``pods`` (one component's) make up: a multinode replica is node_count pods,
    and a partial one counts whole."""
    holding = sum(1 for p in pods if p.is_running_or_starting)
    return -(-holding // max(1, node_count))


def role_counts(dgd: DGD, rp: RolePower, pods: Sequence[PodInfo] | None, adapter_replicas: int | None = None
                ) -> RoleCounts:
    """``pods``: this component's pods (already partitioned), or None when the LIST failed.
    ``adapter_replicas``: its scaling adapter's spec.replicas (not yet copied onto the DGD, it is
    desired all the same)."""
    comp = dgd.component(rp.component)
    st = dgd.status.components.get(rp.component)
    desired = comp.replicas if comp is not None else 0
    return RoleCounts(desired=max(desired, adapter_replicas or 0),
                      ready=st.ready_replicas if st is not None else None,
                      updated=st.updated_replicas if st is not None else None,
                      pods=None if pods is None else pod_replicas(pods, rp.node_count))
