"""Which pod changes can move a cap: the rule the pod view (podcache.py) asks for passes by.

Only changes that can move a cap count: a pod carrying the power annotation appearing,
disappearing, changing its value, phase or readiness, or a pod gaining/losing the annotation. Other pods on
the node (DaemonSets, sidecars without GPUs) never cause a pass.
"""

from __future__ import annotations

from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import PodEvent

# (annotation, phase, terminating)
PodState = tuple[str | None, str | None, bool]


def pod_state(pod: PodInfo) -> PodState:
    """A pod's cap-relevant state."""
    return (pod.annotations.get(POWER_ANNOTATION), pod.phase, pod.terminating)


def cap_relevant_change(old: PodState | None, new: PodState | None) -> bool:
    """True when going from ``old`` to ``new`` (None: absent) can move a cap."""
    if old == new:
        return False
    return (new is not None and new[0] is not None) or (old is not None and old[0] is not None)


def cap_relevant(known: dict[str, PodState], event: PodEvent) -> bool:
    """Update ``known`` (pod UID -> state) with one event; True when the change can move a cap."""
    if event.type == "BOOKMARK" or not event.pod.uid:
        return False
    uid = event.pod.uid
    old = known.get(uid)
    if event.type == "DELETED":
        known.pop(uid, None)
        return (old is not None and old[0] is not None) or POWER_ANNOTATION in event.pod.annotations
    new = pod_state(event.pod)
    known[uid] = new
    return cap_relevant_change(old, new)
