"""The agent inside its worker process: one NodeAgent, passes that never overlap, and the
threads around it (pod watch, heartbeat, local timer, probe endpoint).

Three things ask for a pass:

* a tick (``agent.reconcile`` task): runs at once if no pass is running, else is *dropped*
  (the running pass already reads the current state);
* the pod watch: sets a flag the pass thread serves as soon as the lock is free, so a change
  that lands during a pass gets its own pass afterwards (coalesced, never lost);
* the local timer: when no tick has arrived for three intervals (beat or broker down), the
  pass thread runs a pass every interval until ticks come back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from powerfleet.agent.gpu import GpuBackend, GpuError
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.reconcile import NodeAgent, PassReport, PodLister
from powerfleet.agent.state import StateStore
from powerfleet.clock import Clock, SystemClock
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import ClusterReader
from powerfleet.config import FleetConfig

log = logging.getLogger("powerfleet.agent")

STALE_INTERVALS = 3


def node_pod_lister(cluster: ClusterReader | None, node: str, namespaces: Sequence[str],
                    unavailable: str = "no cluster access") -> PodLister:
    """List this node's pods (field selector ``spec.nodeName``), in each namespace or in all."""
    def list_pods() -> list[PodInfo]:
        if cluster is None:
            raise RuntimeError(unavailable)
        if not namespaces:
            return cluster.list_pods(None, node_name=node)
        out: list[PodInfo] = []
        for ns in namespaces:
            out.extend(cluster.list_pods(ns, node_name=node))
        return out

    return list_pods


class AgentRuntime:
    def __init__(self, agent: NodeAgent, *, interval_s: float, clock: Clock | None = None) -> None:
        self.agent = agent
        self.node = agent.node
        self.interval_s = interval_s
        self.clock = clock or SystemClock()
        self.metrics = agent.metrics
        self._lock = threading.Lock()
        self._kick = threading.Event()
        self._kick_reason = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"agent-passes-{self.node}", daemon=True)
        self._last_tick = self.clock.monotonic()
        self._on_timer = False
        self._stopped = False
        self.stoppers: list[Callable[[], None]] = []  # heartbeat, watcher, probe: stopped before the restore
        self.last_report: PassReport | None = None

    def serves(self, node: str) -> bool:
        return node == self.node

    # -- passes --

    def _run(self, trigger: str) -> PassReport:
        report = self.agent.run_pass(trigger)
        self.last_report = report
        return report

    def tick_pass(self) -> PassReport | None:
        """A pass for a tick; None when one is already running (the tick is dropped, not queued)."""
        self._last_tick = self.clock.monotonic()
        if self._on_timer:
            self._on_timer = False
            log.info("node %s: ticks are back; local timer off", self.node)
        if not self._lock.acquire(blocking=False):
            self.metrics.passes.labels(trigger="tick", outcome="dropped").inc()
            return None
        try:
            return self._run("tick")
        finally:
            self._lock.release()

    def request_pass(self, reason: str) -> None:
        """Ask for a pass soon (from the watch); several requests before it runs make one pass."""
        self._kick_reason = reason
        self._kick.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            kicked = self._kick.wait(timeout=self.interval_s)
            if self._stop.is_set():
                return
            trigger = None
            if kicked:
                self._kick.clear()
                log.info("node %s: pass for %s", self.node, self._kick_reason)
                trigger = "watch"
            elif self.clock.monotonic() - self._last_tick >= STALE_INTERVALS * self.interval_s:
                if not self._on_timer:
                    log.warning("node %s: no tick for %d intervals; running passes on a local timer every %gs",
                                self.node, STALE_INTERVALS, self.interval_s)
                    self._on_timer = True
                trigger = "timer"
            if trigger is None:
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._run(trigger)
                except Exception:
                    log.exception("node %s: %s pass failed", self.node, trigger)

    # -- readiness --

    def readiness(self) -> tuple[bool, str]:
        last = self.agent.last_good_mono
        if last is None:
            self.metrics.last_good_pass_age.set(-1)
            return False, "not-ready: no good pass yet"
        age = self.clock.monotonic() - last
        self.metrics.last_good_pass_age.set(age)
        if age > STALE_INTERVALS * self.interval_s:
            return False, f"not-ready: last good pass {age:.1f}s ago (limit {STALE_INTERVALS * self.interval_s:g}s)"
        return True, f"ok last_good_pass_age_s={age:.1f}"

    # -- lifecycle --

    def start(self) -> "AgentRuntime":
        self.agent.start()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the threads, wait for a running pass, then restore every managed GPU. Never raises."""
        if self._stopped:
            return
        self._stopped = True
        started = self._thread.is_alive()
        self._stop.set()
        self._kick.set()
        for stop in self.stoppers:
            try:
                stop()
            except Exception:
                log.exception("node %s: stopping a helper failed", self.node)
        if not started:
            return  # never ran a pass: no cap of this run to restore
        got = self._lock.acquire(timeout=timeout_s)
        try:
            self.agent.shutdown()
        finally:
            if got:
                self._lock.release()


# -- the one runtime of an agent worker process --

_current: AgentRuntime | None = None


def install(runtime: AgentRuntime | None) -> None:
    global _current
    _current = runtime


def current() -> AgentRuntime | None:
    return _current


def node_state_dir(state_dir: str, node: str) -> Path:
    """``<state_dir>/<node>``: one file per node, so agents of several nodes can share a directory
    (several agents on one machine under ``up``/``demo`` and in tests)."""
    return Path(state_dir) / node


def open_backend(config: FleetConfig, node: str) -> Callable[[], GpuBackend]:
    ac = config.agent
    if ac.gpu_backend == "simulated":
        from powerfleet.agent.simulated import SimulatedGpus

        path = Path(ac.simulated_dir or ".") / f"{node}.json"
        return lambda: SimulatedGpus.shared(path)

    def nvml() -> GpuBackend:
        from powerfleet.agent.nvml import NvmlBackend

        return NvmlBackend()

    return nvml


def connect_cluster(config: FleetConfig) -> tuple[ClusterReader | None, str]:
    """The cluster reader from ``agent.kubeconfig`` or the in-cluster account; (None, why) if neither works."""
    from powerfleet.cluster.kube import KubeCluster

    try:
        if config.agent.kubeconfig:
            return KubeCluster.from_kubeconfig(config.agent.kubeconfig, component="powerfleet-agent"), ""
        return KubeCluster.in_cluster(component="powerfleet-agent"), ""
    except Exception as exc:  # kubernetes.config raises several types; any means "no cluster"
        return None, f"no cluster access ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"


def endpoint(config: FleetConfig, override_port: int | None = None) -> tuple[str, int]:
    """Where the agent serves /readyz and /metrics: ``--metrics-port``, else ``agent.probe_port``
    (the chart's readiness probe), else ``metrics.port`` (what `up` assigns per process); 0: off."""
    if override_port is not None:
        return config.metrics.address, override_port
    if config.agent.probe_port:
        return config.agent.probe_address, config.agent.probe_port
    return config.metrics.address, config.metrics.port


def build_runtime(config: FleetConfig, node: str, *, broker_url: str | None = None,
                  metrics: AgentMetrics | None = None, clock: Clock | None = None,
                  probe: tuple[str, int] | None = None) -> AgentRuntime:
    """Everything an agent worker needs, from the config. Starts its helper threads, no pass."""
    ac = config.agent
    clock = clock or SystemClock()
    metrics = metrics or AgentMetrics()
    cluster, why = connect_cluster(config)
    if cluster is None:
        log.error("agent %s: %s; every pass is skipped until it is fixed", node, why)
    agent = NodeAgent(node, open_gpus=open_backend(config, node),
                      list_pods=node_pod_lister(cluster, node, ac.namespaces, why),
                      proc_root=ac.proc_root, state=StateStore(node_state_dir(ac.state_dir, node)), clock=clock,
                      safe_default_watts=ac.safe_default_watts, metrics=metrics)
    rt = AgentRuntime(agent, interval_s=config.beat.reconcile_interval_s, clock=clock)
    if cluster is not None and ac.watch:
        from powerfleet.agent.watcher import PodWatcher

        rt.stoppers.append(PodWatcher(cluster, node, ac.namespaces, rt.request_pass).start().stop)
    if broker_url is not None:
        import redis

        from powerfleet.agent.presence import Heartbeat

        client = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
        rt.stoppers.append(Heartbeat(client, node, config.beat.reconcile_interval_s, clock).start().stop)
    address, port = probe if probe is not None else endpoint(config)
    if port:
        from powerfleet.agent.probe import ProbeServer

        rt.stoppers.append(ProbeServer(address, port, rt.readiness, metrics.registry).start().stop)
    return rt


__all__ = ["AgentRuntime", "GpuError", "build_runtime", "current", "install", "node_pod_lister"]
