"""The control worker's ledger view: the cluster's pods LISTed once, then kept by a WATCH.

A budget tick charges every GPU pod on a rack, so without this it LISTs every pod of the cluster
each tick: at 80,000 GPU pods about 10 s of client CPU against a real kube-apiserver
(docs/benchmarks.md "Scale"), most of it decoding JSON that has not changed. With
``budget.pod_cache`` on, one thread per control process keeps the ledger's views in memory as
client-go's reflector does: a paginated LIST, then a watch from its resourceVersion with BOOKMARKs,
each watch ended by the server after a timeout drawn in [5, 10) min and resumed from its last
version; a ``410 Gone`` (the server's history moved past that version) relists.

What a tick reads is then a copy of a dict's values. The rules that keep it safe:

* **Never a partial view.** ``list_gpu_pods`` serves memory only while the view is synced (its
  LIST done and its watch unbroken). While it (re)lists it waits for it (up to ``sync_wait_s``);
  while it is failing, or past that wait, the tick LISTs for itself as it did without the cache,
  and that LIST's error is the tick's error. So a broken watch costs the old price, never a stale
  ledger.
* **A half-open connection is noticed** by TCP keepalive within 60 s (keepalive.py); a watch's
  read deadline is its server timeout plus ``READ_TIMEOUT_S``.
* **Memory is bounded by what the ledger reads**: ``keep`` drops every pod the ledger ignores (no
  GPUs, no deployment label, not an agent), so daemon pods and CPU workloads cost nothing. A kept
  view is ~2.9 kB (bench/scale.py part r); 80,000 GPU pods hold ~235 MB per control process.
* **Lag**: an event reaches the view within the watch's delivery time (milliseconds on a healthy
  server), the same lag every controller reading an informer cache has. The ledger is a
  snapshot either way: a pod created just after a LIST was equally unseen.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, Protocol

from powerfleet.cluster.gpu_pods import GpuPod, PodChange
from powerfleet.cluster.ports import ClusterError

log = logging.getLogger("powerfleet.budget")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 25.0  # a watch's client deadline is its server timeout plus this
WATCH_MIN_S = 300  # each watch's server timeout is drawn in [5, 10) min, as client-go's reflector draws it

State = Literal["listing", "synced", "failing", "stopped"]


class LedgerPodSource(Protocol):
    """What the cache reads through (``KubeGpuPods``)."""

    def list_gpu_pods(self, label_selector: str | None = None) -> list[GpuPod]: ...

    def list_gpu_pods_with_version(self, label_selector: str | None = None) -> tuple[list[GpuPod], str]: ...

    def watch_gpu_pods(self, resource_version: str, *, timeout_seconds: int,
                       request_timeout: tuple[float, float]) -> Iterable[PodChange]: ...


def selector_terms(selector: str | None) -> list[tuple[str, str | None]] | None:
    """A label selector the cache answers itself: comma-separated ``key`` (exists) or ``key=value``
    terms, as [(key, value or None)]; None for anything else (it is then sent to the server)."""
    if not selector:
        return []
    terms: list[tuple[str, str | None]] = []
    for raw in selector.split(","):
        term = raw.strip()
        key, eq, value = term.partition("=")
        if not key or any(c in term for c in "!()<> ") or "=" in value or (eq and not value.strip()):
            return None
        terms.append((key.strip(), value.strip() if eq else None))
    return terms


def _selected(labels: Mapping[str, str], terms: list[tuple[str, str | None]]) -> bool:
    return all(k in labels if v is None else labels.get(k) == v for k, v in terms)


class GpuPodCache:
    """``list_gpu_pods`` from memory, kept by one LIST and a WATCH of every namespace.

    Start it with ``start()`` (a daemon thread); ``stats`` counts what it did, for the bench and
    the tests."""

    def __init__(self, source: LedgerPodSource, *, keep: Callable[[GpuPod], bool] = lambda p: True,
                 watch_timeout_s: int | None = None, retry_s: float = 2.0, sync_wait_s: float = 30.0,
                 rng: random.Random | None = None) -> None:
        self.source, self.keep = source, keep
        self.watch_timeout_s, self.retry_s, self.sync_wait_s = watch_timeout_s, retry_s, sync_wait_s
        self._rng = rng or random.Random()
        self._pods: dict[str, GpuPod] = {}
        self._version = ""
        self._state: State = "listing"
        self.problem = "not listed yet"
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self.stats = {"lists": 0, "watches": 0, "events": 0, "served": 0, "fallbacks": 0}
        self._thread = threading.Thread(target=self._run, name="ledger-pods", daemon=True)

    # -- what a tick reads --

    @property
    def state(self) -> State:
        return self._state

    def list_gpu_pods(self, label_selector: str | None = None) -> list[GpuPod]:
        """The kept pods (``label_selector``: those it selects), or a LIST of the server's when the
        view is not synced or the selector is one the cache does not answer."""
        terms = selector_terms(label_selector)
        if terms is not None and (self._state == "synced" or (self._state == "listing" and
                                                               self._synced.wait(self.sync_wait_s))):
            with self._lock:
                if self._state == "synced":  # not broken between the wait and now
                    self.stats["served"] += 1
                    return [p for p in self._pods.values() if _selected(p.labels, terms)]
        self.stats["fallbacks"] += 1
        return self.source.list_gpu_pods(label_selector)

    def size(self) -> int:
        """Pods held."""
        return len(self._pods)

    # -- the watcher --

    def next_watch_timeout_s(self) -> int:
        if self.watch_timeout_s is not None:
            return self.watch_timeout_s
        return self._rng.randrange(WATCH_MIN_S, 2 * WATCH_MIN_S)

    def _list(self) -> None:
        self.stats["lists"] += 1
        pods, version = self.source.list_gpu_pods_with_version()
        kept = {p.uid: p for p in pods if p.uid and self.keep(p)}
        with self._lock:
            self._pods, self._version = kept, version
            self._set_state("synced", "")

    def _watch(self) -> None:
        self.stats["watches"] += 1
        timeout = self.next_watch_timeout_s()
        for change in self.source.watch_gpu_pods(self._version, timeout_seconds=timeout,
                                                 request_timeout=(CONNECT_TIMEOUT_S, timeout + READ_TIMEOUT_S)):
            if self._stop.is_set():
                return
            self._apply(change)

    def _apply(self, change: PodChange) -> None:
        self.stats["events"] += 1
        with self._lock:
            pod = change.pod
            if pod is not None and pod.uid:
                if change.type == "DELETED" or not self.keep(pod):
                    self._pods.pop(pod.uid, None)  # a pod that stops mattering (or never did) is not held
                else:
                    self._pods[pod.uid] = pod
            if change.resource_version:
                self._version = change.resource_version

    def _set_state(self, state: State, problem: str) -> None:
        self._state, self.problem = state, problem
        if state == "synced":
            self._synced.set()
        else:
            self._synced.clear()

    def _run(self) -> None:
        reused = False  # the next watch goes out on a pooled connection the server may have closed
        while not self._stop.is_set():
            try:
                if self._state != "synced":
                    reused = False
                    self._list()
                self._watch()  # returns when the server ends the watch: resume from the version held
                reused = True
            except ClusterError as exc:
                if exc.status == 410:
                    with self._lock:
                        self._set_state("listing", "watch expired (410); relisting")
                    log.info("ledger pod view: %s", self.problem)
                    continue
                # With retries=0 a keep-alive connection the server closed after the last watch
                # fails the next request at once: one new attempt from the same version is that
                # retry, and nothing is missed (a relist would re-read every pod of the cluster).
                if reused and exc.status is None and any(
                        m in str(exc) for m in ("ProtocolError", "RemoteDisconnected", "Connection aborted")):
                    reused = False
                    continue
                self._failed(str(exc).splitlines()[0][:200])
            except Exception as exc:  # undecodable objects, bugs: the view must not stay up on them
                log.exception("ledger pod view failed")
                self._failed(f"{type(exc).__name__}: {exc}"[:200])
        with self._lock:
            self._set_state("stopped", "stopped")

    def _failed(self, why: str) -> None:
        with self._lock:
            first = self._state != "failing"
            self._set_state("failing", why)
        if first:
            log.warning("ledger pod view failed (%s); ticks LIST for themselves until it works; retrying every %gs",
                        why, self.retry_s)
        self._stop.wait(self.retry_s)  # then relist; it stays "failing" (ticks LIST, none waits) until that works

    def start(self) -> "GpuPodCache":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # the thread notices at the next event or when its watch ends; it is a daemon
