"""The agent's pod view: one LIST then a WATCH per namespace scope, kept in memory.

A pass reads ``snapshot()`` instead of listing: at steady state the agent makes one API call
every 5 to 10 minutes per scope (a watch that the server ends after a timeout drawn in
[``WATCH_MIN_S``, 2 x ``WATCH_MIN_S``), as client-go's reflector draws it, resumed from the last
resourceVersion), not one LIST per pass. Ten thousand agents resuming every 30 s cost the API
server ~330 watches a second; drawn and spread, ~22 (bench/scale_watch.py). A watch on a quiet
node can be silent for its whole length (the server sends a bookmark only once its version has
moved), so its read deadline is its length plus ``READ_TIMEOUT_S``; a peer that is gone (a
half-open connection) is noticed sooner, by TCP keepalive on the agent's client (build.py). The
watch asks for BOOKMARKs: the server
sends its current version before each watch ends, so a node whose pods never change resumes from
a version the server's watch cache still holds. Without them its version stays at the LIST's, and
once the cluster's other pods have moved the cache past it (about 75 s of history on a real
kube-apiserver) every resumed watch is a 410 and a relist: bench/scale_watch.py measured it.
Every call is bounded: LISTs use ``resource_version="0"`` (served from the API server's cache),
a server-side timeout and a client deadline (connect, read); the API client has no retries
behind it (build.py).

``snapshot()`` raises ``PodViewStale`` while any scope is not synced (before its first LIST,
after a watch error until the relist succeeds): the pass is then skipped and no cap changes,
exactly as a failed LIST did. So a partial view over several namespaces never reaches the
policy.

The watch also asks for a pass (``on_change``) when a pod that carries the power annotation
appears, goes, changes its value or phase, flips Ready or starts a container (watcher.py;
docs/agent.md, "Fast path"). Calls go through
the cluster adapter (``KubeCluster.list_pods_with_version``, ``watch_pods``), whose methods the
chart's RBAC is checked against.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from powerfleet.agent.watcher import PodState, cap_relevant_change, change_reason, pod_state
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import ClusterError, PodEvent

log = logging.getLogger("powerfleet.agent")

LIST_TIMEOUT_S = 20  # server side
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 25.0  # client side, per LIST; a watch gets its server timeout plus this
WATCH_MIN_S = 300  # client-go's reflector: each watch's server timeout is drawn in [5, 10) min


class PodViewStale(RuntimeError):
    """The pod view is not complete: the pass must not run on it."""


class _Scope:
    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        self.pods: dict[str, PodInfo] = {}
        self.states: dict[str, PodState] = {}
        self.synced = False
        self.problem = "not listed yet"

    @property
    def name(self) -> str:
        return self.namespace or "all namespaces"


class PodCache:
    def __init__(self, cluster: Any, node: str, namespaces: Sequence[str], on_change: Callable[[str], None], *,
                 watch_timeout_s: int | None = None, retry_s: float = 2.0, rng: random.Random | None = None) -> None:
        self.cluster, self.node, self.on_change = cluster, node, on_change
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s  # None: drawn per watch
        self._rng = rng or random.Random()
        self._scopes = [_Scope(ns) for ns in (list(namespaces) or [None])]
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self.calls = {"list": 0, "watch": 0}  # API requests made, for the bench
        self._threads = [threading.Thread(target=self._run, args=(s,), name=f"agent-pods-{s.namespace or 'all'}",
                                          daemon=True) for s in self._scopes]

    # -- the pass's view --

    def snapshot(self) -> list[PodInfo]:
        with self._mutex:
            stale = [s for s in self._scopes if not s.synced]
            if stale:
                raise PodViewStale("pod view incomplete: " + "; ".join(f"{s.name}: {s.problem}" for s in stale))
            return [p for s in self._scopes for p in s.pods.values()]

    # -- API calls --

    def _list(self, scope: _Scope) -> str:
        self.calls["list"] += 1
        listed, version = self.cluster.list_pods_with_version(
            scope.namespace, node_name=self.node, resource_version="0",
            request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        pods = {p.uid.lower(): p for p in listed if p.uid}
        states = {u: pod_state(p) for u, p in pods.items()}
        with self._mutex:
            changed = any(cap_relevant_change(scope.states.get(u), s) for u, s in states.items()) or any(
                cap_relevant_change(s, None) for u, s in scope.states.items() if u not in states)
            first = not scope.synced
            scope.pods, scope.states, scope.synced, scope.problem = pods, states, True, ""
        if first or changed:
            self.on_change(f"pod list of {scope.name} ({len(pods)} pods)")
        return version

    def next_watch_timeout_s(self) -> int:
        """The server-side timeout of the next watch: drawn, so that agents started together (a
        rollout) do not resume together, and long, so that a fleet's resumes stay few."""
        if self.watch_timeout_s is not None:
            return self.watch_timeout_s
        return self._rng.randrange(WATCH_MIN_S, 2 * WATCH_MIN_S)

    def _watch(self, scope: _Scope, version: str) -> str:
        self.calls["watch"] += 1
        timeout = self.next_watch_timeout_s()
        for event in self.cluster.watch_pods(scope.namespace, node_name=self.node, resource_version=version or None,
                                             timeout_seconds=timeout, bookmarks=True,
                                             request_timeout=(CONNECT_TIMEOUT_S, timeout + READ_TIMEOUT_S)):
            if self._stop.is_set():
                return version
            version = self._apply(scope, event) or version
        return version

    def _apply(self, scope: _Scope, event: PodEvent) -> str | None:
        if event.type == "ERROR":
            raise ClusterError(f"watch error event for {scope.name}", status=500)
        uid = event.pod.uid.lower()
        if event.type == "BOOKMARK" or not uid:
            return event.resource_version or None
        new = None if event.type == "DELETED" else pod_state(event.pod)
        with self._mutex:
            old = scope.states.get(uid)
            if new is None:
                scope.pods.pop(uid, None)
                scope.states.pop(uid, None)
            else:
                scope.pods[uid], scope.states[uid] = event.pod, new
        if cap_relevant_change(old, new):
            self.on_change(f"pod {event.pod.namespace}/{event.pod.name} {change_reason(old, new)}")
        return event.resource_version or None

    # -- the loop --

    def _run(self, scope: _Scope) -> None:
        failing = False
        version = ""
        reused = False  # the next request goes out on a pooled connection the server may have closed
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._list(scope)
                version = self._watch(scope, version)
                reused = True
                if failing:
                    log.info("pod view of %s on %s works again", scope.name, self.node)
                failing = False
            except ClusterError as exc:
                if exc.status == 410:
                    version, reused = "", False
                    self._stale(scope, "watch expired (410); relisting")
                    continue
                # With retries=0 a keep-alive connection the server closed after the last watch
                # fails the next request at once; one immediate new attempt is that retry, and
                # the view stays as it is (the watch resumes at its version: nothing is missed).
                if reused and exc.status is None and ("ProtocolError" in str(exc) or "RemoteDisconnected" in str(exc)):
                    reused = False
                    continue
                version, reused = "", False
                failing = self._failed(scope, failing, str(exc).splitlines()[0][:200], traceback=False)
            except Exception as exc:  # undecodable objects, bugs: the traceback once per outage
                version, reused = "", False
                failing = self._failed(scope, failing, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                       traceback=True)

    def _stale(self, scope: _Scope, why: str) -> None:
        with self._mutex:
            scope.synced, scope.problem = False, why

    def _failed(self, scope: _Scope, failing: bool, why: str, *, traceback: bool) -> bool:
        self._stale(scope, why)
        if not failing:
            if traceback:
                log.exception("pod view of %s on %s failed (%s); retrying every %gs", scope.name, self.node, why,
                              self.retry_s)
            else:
                log.warning("pod view of %s on %s failed (%s); passes are skipped until it works; retrying every %gs",
                            scope.name, self.node, why, self.retry_s)
        self._stop.wait(self.retry_s)
        return True

    def start(self) -> "PodCache":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # threads notice at the next event or watch timeout; they are daemons
