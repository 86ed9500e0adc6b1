"""The fast path: watch the node's pods and ask for a pass when an annotated pod starts, stops
or changes, so a new cap is live within seconds instead of at the next tick.

Only changes that can move a cap count: a pod carrying the power annotation appearing,
disappearing, changing its value or phase, or a pod gaining/losing the annotation. Other pods
on the node (DaemonSets, sidecars without GPUs) never cause a pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import ClusterError, ClusterReader, PodEvent

log = logging.getLogger("powerfleet.agent")

PodState = tuple[str | None, str | None, bool]  # (annotation, phase, terminating)


def _state(pod: PodInfo) -> PodState:
    return (pod.annotations.get(POWER_ANNOTATION), pod.phase, pod.terminating)


def cap_relevant(known: dict[str, PodState], event: PodEvent) -> bool:
    """Update ``known`` (pod UID -> state) with one event; True when the change can move a cap."""
    if event.type == "BOOKMARK" or not event.pod.uid:
        return False
    uid = event.pod.uid
    old = known.get(uid)
    if event.type == "DELETED":
        known.pop(uid, None)
        return (old is not None and old[0] is not None) or POWER_ANNOTATION in event.pod.annotations
    new = _state(event.pod)
    known[uid] = new
    if old == new:
        return False
    return new[0] is not None or (old is not None and old[0] is not None)


class PodWatcher:
    """One daemon thread per namespace scope, re-watching after every timeout or error."""

    def __init__(self, cluster: ClusterReader, node: str, namespaces: Sequence[str],
                 on_change: Callable[[str], None], *, timeout_seconds: int = 30, retry_s: float = 2.0) -> None:
        self.cluster, self.node, self.on_change = cluster, node, on_change
        self.scopes: list[str | None] = list(namespaces) or [None]
        self.timeout_seconds, self.retry_s = timeout_seconds, retry_s
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(ns,), name=f"agent-watch-{ns or 'all'}", daemon=True)
                         for ns in self.scopes]

    def start(self) -> "PodWatcher":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # threads notice at the next event or watch timeout; they are daemons

    def _run(self, namespace: str | None) -> None:
        known: dict[str, PodState] = {}
        version: str | None = None
        failing = False
        while not self._stop.is_set():
            try:
                for event in self.cluster.watch_pods(namespace, node_name=self.node, resource_version=version,
                                                     timeout_seconds=self.timeout_seconds):
                    if self._stop.is_set():
                        return
                    version = event.resource_version or version
                    if cap_relevant(known, event):
                        self.on_change(f"pod {event.pod.namespace}/{event.pod.name} {event.type.lower()}")
                if failing:
                    log.info("pod watch on %s works again", self.node)
                failing = False
            except ClusterError as exc:
                # 410: our version is too old. Either way start over: the fresh ADDED burst
                # re-establishes what is on the node and asks for one (coalesced) pass.
                version = None
                known.clear()
                if exc.status != 410:
                    if not failing:
                        log.warning("pod watch on %s failed (%s); retrying every %gs", self.node,
                                    str(exc).splitlines()[0], self.retry_s)
                    failing = True
                    self._stop.wait(self.retry_s)
            except Exception:
                # Unexpected (e.g. an object the client cannot decode): the traceback once per
                # outage, not once per retry; passes go on through ticks and the local timer.
                if not failing:
                    log.exception("pod watch on %s crashed; retrying every %gs", self.node, self.retry_s)
                failing = True
                version = None
                known.clear()
                self._stop.wait(self.retry_s)
