"""The agent's pod view: one LIST then a WATCH per namespace scope, kept in memory.

A pass reads ``snapshot()`` instead of listing: at steady state the agent makes about two API
calls a minute per scope (a watch that the server ends every ``watch_timeout_s``, resumed from
the last resourceVersion), not one LIST per pass. Every call is bounded: LISTs use
``resource_version="0"`` (served from the API server's cache), a server-side timeout and a
client deadline (connect, read); the API client has no retries behind it (build.py).

``snapshot()`` raises ``PodViewStale`` while any scope is not synced (before its first LIST,
after a watch error until the relist succeeds): the pass is then skipped and no cap changes,
exactly as a failed LIST did. So a partial view over several namespaces never reaches the
policy.

The watch also asks for a pass (``on_change``) when a pod that carries the power annotation
appears, goes, changes its value or phase, flips Ready or starts a container, so a new
workload's cap is applied as soon as it runs (docs/agent.md, "Fast path").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from powerfleet.agent.watcher import PodState, cap_relevant_change, pod_state
from powerfleet.cluster.kube import pod_info
from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")

LIST_TIMEOUT_S = 20  # server side
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 25.0  # client side, per LIST; a watch gets its server timeout plus this


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
    def __init__(self, core: client.CoreV1Api, node: str, namespaces: Sequence[str],
                 on_change: Callable[[str], None], *, watch_timeout_s: int = 30, retry_s: float = 2.0) -> None:
        self.core, self.node, self.on_change = core, node, on_change
        self.watch_timeout_s, self.retry_s = watch_timeout_s, retry_s
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

    def _selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def _list(self, scope: _Scope) -> str:
        kw: dict[str, Any] = {"field_selector": self._selector(), "resource_version": "0",
                              "timeout_seconds": LIST_TIMEOUT_S, "_request_timeout": (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)}
        self.calls["list"] += 1
        if scope.namespace is None:
            listed = self.core.list_pod_for_all_namespaces(**kw)
        else:
            listed = self.core.list_namespaced_pod(scope.namespace, **kw)
        pods, states = {}, {}
        for item in listed.items or ():
            info = pod_info(item)
            if info.uid:
                pods[info.uid.lower()] = info
                states[info.uid.lower()] = pod_state(info, item)
        with self._mutex:
            changed = any(cap_relevant_change(scope.states.get(u), s) for u, s in states.items()) or any(
                cap_relevant_change(s, None) for u, s in scope.states.items() if u not in states)
            first = not scope.synced
            scope.pods, scope.states, scope.synced, scope.problem = pods, states, True, ""
        if first or changed:
            self.on_change(f"pod list of {scope.name} ({len(pods)} pods)")
        return str(listed.metadata.resource_version or "")

    def _watch(self, scope: _Scope, version: str) -> str:
        kw: dict[str, Any] = {"field_selector": self._selector(), "timeout_seconds": self.watch_timeout_s,
                              "allow_watch_bookmarks": True,
                              "_request_timeout": (CONNECT_TIMEOUT_S, self.watch_timeout_s + READ_TIMEOUT_S)}
        if version:
            kw["resource_version"] = version
        w = watch.Watch()
        self.calls["watch"] += 1
        try:
            if scope.namespace is None:
                stream = w.stream(self.core.list_pod_for_all_namespaces, **kw)
            else:
                stream = w.stream(self.core.list_namespaced_pod, scope.namespace, **kw)
            for event in stream:
                if self._stop.is_set():
                    return version
                version = self._apply(scope, event) or version
        finally:
            w.stop()
        return version

    def _apply(self, scope: _Scope, event: dict[str, Any]) -> str | None:
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR" or not isinstance(obj, client.V1Pod):
            code = obj.get("code") if isinstance(obj, dict) else None
            raise ApiException(status=code or 500, reason=f"watch error event: {obj!r:.200}")
        rv = obj.metadata.resource_version if obj.metadata else None
        if kind == "BOOKMARK":
            return rv
        info = pod_info(obj)
        uid = info.uid.lower()
        if not uid:
            return rv
        new = None if kind == "DELETED" else pod_state(info, obj)
        with self._mutex:
            old = scope.states.get(uid)
            if new is None:
                scope.pods.pop(uid, None)
                scope.states.pop(uid, None)
            else:
                scope.pods[uid], scope.states[uid] = info, new
        if cap_relevant_change(old, new):
            self.on_change(f"pod {info.namespace}/{info.name} {str(kind).lower()}")
        return rv

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
            except urllib3.exceptions.MaxRetryError as exc:
                # With retries=0 a keep-alive connection the server closed after the last watch
                # fails the next request at once; one immediate new attempt is that retry, and
                # the view stays as it is (nothing was missed: the watch resumes at its version).
                if reused and isinstance(exc.reason, urllib3.exceptions.ProtocolError):
                    reused = False
                    continue
                version, reused = "", False
                failing = self._failed(scope, failing, f"{type(exc.reason).__name__}: {exc.reason}", traceback=False)
            except ApiException as exc:
                version, reused = "", False  # relist: 410 (too old) or any error; the view is stale until then
                if exc.status != 410:
                    failing = self._failed(scope, failing, f"{exc.status} {exc.reason}", traceback=False)
                else:
                    self._stale(scope, "watch expired (410); relisting")
            except Exception as exc:  # transport errors, undecodable objects: the traceback once per outage
                version, reused = "", False
                failing = self._failed(scope, failing, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                       traceback=not isinstance(exc, OSError) and "urllib3" not in type(exc).__module__)

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
