"""Which pod changes can move a cap: the rule the pod view (podcache.py) asks for passes by.

Only changes of a pod that carries (or carried) the power annotation count: it appears,
disappears, changes its value or phase, starts terminating, flips Ready, or one of its
containers starts (or restarts); or a pod gains or loses the annotation. Ready flips and
container starts matter because that is when the kubelet has allocated the pod's GPUs and its
first process is about to run: the pass then caps the GPU from its PodResources allocation
without waiting for the tick. Other pods on the node (DaemonSets, sidecars without GPUs) never
cause a pass.
"""

from __future__ import annotations

from typing import NamedTuple

from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import PodEvent


class PodState(NamedTuple):
    annotation: str | None
    phase: str | None
    terminating: bool
    ready: bool = False
    started: tuple[str, ...] = ()  # PodInfo.started_containers


def pod_state(pod: PodInfo) -> PodState:
    """A pod's cap-relevant state."""
    return PodState(pod.annotations.get(POWER_ANNOTATION), pod.phase, pod.terminating, pod.ready,
                    pod.started_containers)


def cap_relevant_change(old: PodState | None, new: PodState | None) -> bool:
    """True when going from ``old`` to ``new`` (None: absent) can move a cap."""
    if old == new:
        return False
    return (new is not None and new.annotation is not None) or (old is not None and old.annotation is not None)


def change_reason(old: PodState | None, new: PodState | None) -> str:
    """What happened, for the pass's log line (only called for a cap-relevant change)."""
    if old is None:
        return "added"
    if new is None:
        return "deleted"
    if old.annotation != new.annotation:
        return "annotation changed"
    if new.ready != old.ready:
        return "became ready" if new.ready else "became unready"
    if set(new.started) - set(old.started):
        return "container started"
    return "modified"


def cap_relevant(known: dict[str, PodState], event: PodEvent) -> bool:
    """Update ``known`` (pod UID -> state) with one event; True when the change can move a cap."""
    if event.type == "BOOKMARK" or not event.pod.uid:
        return False
    uid = event.pod.uid
    old = known.get(uid)
    if event.type == "DELETED":
        known.pop(uid, None)
        return (old is not None and old.annotation is not None) or POWER_ANNOTATION in event.pod.annotations
    new = pod_state(event.pod)
    known[uid] = new
    return cap_relevant_change(old, new)
