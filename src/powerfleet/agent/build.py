"""Building an agent's runtime from the config: the GPU backend, the cluster reader, the
pod lister, the state store, and the helper threads (pod watch, heartbeat, probe endpoint).

Kept apart from ``runtime`` so that the task module (imported by every fleet process) does
not pull in the Kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from powerfleet.agent.gpu import GpuBackend
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.nvml import NvmlBackend
from powerfleet.agent.drain import DrainWatcher
from powerfleet.agent.annotate import ReportAnnotator
from powerfleet.agent.evidence import EvidencePublisher, Handoff, Sink
from powerfleet.agent.lock import LocalLock, NodeLock
from powerfleet.agent.presence import Heartbeat, heartbeat_ttl_s
from powerfleet.agent.probe import ProbeServer
from powerfleet.agent.reconcile import NodeAgent, PodLister
from powerfleet.agent.runtime import AgentRuntime
from powerfleet.agent.simulated import SimulatedGpus
from powerfleet.agent.state import StateStore
from powerfleet.agent.podcache import PodCache
from powerfleet.agent.throttle import OVERLAYS_FILE, FallbackWatch, OverlayStore
from powerfleet.broker.clients import redis_client
from powerfleet.agent.podresources import PodResourcesClient
from powerfleet.clock import Clock, SystemClock
from powerfleet.cluster.keepalive import watch_api_client
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.pod_annotations import KubePodAnnotations
from powerfleet.cluster.ports import ClusterReader
from powerfleet.config import FleetConfig

log = logging.getLogger("powerfleet.agent")


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


def node_state_dir(state_dir: str, node: str) -> Path:
    """``<state_dir>/<node>``: one file per node, so agents of several nodes can share a directory
    (several agents on one machine under ``up``/``demo`` and in tests)."""
    return Path(state_dir) / node


def open_backend(config: FleetConfig, node: str) -> Callable[[], GpuBackend]:
    ac = config.agent
    if ac.gpu_backend == "simulated":
        path = Path(ac.simulated_dir or ".") / f"{node}.json"
        return lambda: SimulatedGpus.shared(path)

    return NvmlBackend


def connect_cluster(config: FleetConfig) -> tuple[KubeCluster | None, str]:
    """The cluster from ``agent.kubeconfig`` or the in-cluster account; (None, why) if neither works.

    The client makes no retries (urllib3 ``retries=0``): every call's deadline is its own, so a
    server that accepts and never answers costs one timeout, not four."""
    try:
        return KubeCluster(watch_api_client(config.agent.kubeconfig), component="powerfleet-agent"), ""
    except Exception as exc:  # kubernetes.config raises several types; any means "no cluster"
        return None, f"no cluster access ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"


def pod_view(cluster: KubeCluster | None, node: str, namespaces: Sequence[str], on_change: Callable[[str], None],
             unavailable: str) -> tuple[PodLister, PodCache | None]:
    """The watch-backed pod view and its lister; without a cluster, a lister that says why."""
    if cluster is None:
        return node_pod_lister(None, node, namespaces, unavailable), None
    cache = PodCache(cluster, node, namespaces, on_change)
    return cache.snapshot, cache


def endpoint(config: FleetConfig, override_port: int | None = None) -> tuple[str, int]:
    """Where the agent serves /readyz and /metrics: ``--metrics-port``, else ``agent.probe_port``
    (the chart's readiness probe), else ``metrics.port`` (what `up` assigns per process); 0: off."""
    if override_port is not None:
        return config.metrics.address, override_port
    if config.agent.probe_port:
        return config.agent.probe_address, config.agent.probe_port
    return config.metrics.address, config.metrics.port


def take_lock(client: redis.Redis, node: str, interval_s: float) -> NodeLock:
    """The node lock, or ``LockHeld`` when another live agent has it. With Redis unreachable the
    agent starts without it and sets nothing until a heartbeat takes it (its caps stay meanwhile)."""
    lock = NodeLock(client, node, heartbeat_ttl_s(interval_s))
    try:
        lock.acquire()
    except (redis.RedisError, OSError) as exc:
        lock.why = f"Redis unreachable at start ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        lock.unreachable = True
        log.warning("agent %s: cannot take the node lock: %s; until it is taken only the caps the state owes are "
                    "applied", node, lock.why)
    return lock


def local_lock_path(state_dir: str, node: str) -> Path:
    """``<state_dir>/<node>.lock``: beside the node's state directory, not in it (a state directory
    that exists without its record means a lost record, agent/state.py)."""
    return Path(state_dir) / f"{node}.lock"


def build_runtime(config: FleetConfig, node: str, *, broker_url: str | None = None,
                  metrics: AgentMetrics | None = None, clock: Clock | None = None,
                  probe: tuple[str, int] | None = None) -> AgentRuntime:
    """Everything an agent worker needs, from the config. Starts its helper threads, no pass."""
    ac = config.agent
    local = LocalLock(local_lock_path(ac.state_dir, node), node).acquire()  # LockHeld: refuse to start
    try:
        return _build(config, node, local, broker_url=broker_url, metrics=metrics, clock=clock, probe=probe)
    except BaseException:
        local.release()
        raise


def _build(config: FleetConfig, node: str, local: LocalLock, *, broker_url: str | None, metrics: AgentMetrics | None,
           clock: Clock | None, probe: tuple[str, int] | None) -> AgentRuntime:
    ac = config.agent
    clock = clock or SystemClock()
    metrics = metrics or AgentMetrics()
    cluster, why = connect_cluster(config)
    if cluster is None:
        log.error("agent %s: %s; every pass is skipped until it is fixed", node, why)
    kicks: list[Callable[[str], None]] = []  # the runtime's request_pass, once it exists
    list_pods, cache = pod_view(cluster, node, ac.namespaces, lambda reason: [k(reason) for k in kicks], why)
    agent = NodeAgent(node, open_gpus=open_backend(config, node), list_pods=list_pods,
                      proc_root=ac.proc_root, state=StateStore(node_state_dir(ac.state_dir, node)), clock=clock,
                      safe_default_watts=ac.safe_default_watts, safe_default_fraction=ac.safe_default_fraction,
                      complete_view=not ac.namespaces, metrics=metrics,
                      allocations=PodResourcesClient(ac.podresources_socket.replace("{node}", node)).list)
    rt = AgentRuntime(agent, interval_s=config.beat.reconcile_interval_s, clock=clock, poll_s=ac.process_poll_s)
    rt.local_lock = local
    # the power guard's overlays (agent/throttle.py), kept in the state directory for the fallback after a restart
    agent.overlays = OverlayStore(clock, metrics.registry, path=node_state_dir(ac.state_dir, node) / OVERLAYS_FILE,
                                  groups=config.budget.oversubscribed())
    rt.stoppers.append(FallbackWatch(agent.overlays, rt.request_pass).start().stop)
    if broker_url is not None:  # first: a second agent for the node refuses before it starts anything
        client = redis_client(broker_url, config.broker, socket_timeout=5, socket_connect_timeout=5)
        rt.lock = take_lock(client, node, config.beat.reconcile_interval_s)  # LockHeld: refuse to start
    if cache is not None:
        if ac.watch:
            kicks.append(rt.request_pass)
        rt.stoppers.append(cache.start().stop)
    sinks: list[Sink] = []
    if broker_url is not None:
        drain = DrainWatcher(client, rt, clock)
        drain.check_once()  # a node drained before this agent started stays drained from its first pass
        rt.stoppers.append(drain.start().stop)
        rt.stoppers.append(Heartbeat(client, node, config.beat.reconcile_interval_s, clock, lock=rt.lock).start().stop)
        sinks.append(EvidencePublisher(client, node, heartbeat_ttl_s(config.beat.reconcile_interval_s)).publish)
    if cluster is not None and ac.enforcement_annotation:
        sinks.append(ReportAnnotator(KubePodAnnotations(cluster), node, clock).publish)
    if sinks:
        handoff = Handoff(node, sinks).start()
        rt.reporters.append(handoff.offer)
        rt.stoppers.append(handoff.stop)
    address, port = probe if probe is not None else endpoint(config)
    if port:
        rt.stoppers.append(ProbeServer(address, port, rt.readiness, metrics.registry).start().stop)
    return rt
