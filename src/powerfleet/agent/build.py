"""Building an agent's runtime from the config: the GPU backend, the cluster reader, the
pod lister, the state store, and the helper threads (pod watch, heartbeat, probe endpoint).

Kept apart from ``runtime`` so that the task module (imported by every fleet process) does
not pull in the Kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from powerfleet.agent.gpu import GpuBackend
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.nvml import NvmlBackend
from powerfleet.agent.presence import Heartbeat
from powerfleet.agent.probe import ProbeServer
from powerfleet.agent.reconcile import NodeAgent, PodLister
from powerfleet.agent.runtime import AgentRuntime
from powerfleet.agent.simulated import SimulatedGpus
from powerfleet.agent.state import StateStore
from powerfleet.agent.watcher import PodWatcher
from powerfleet.broker.clients import redis_client
from powerfleet.clock import Clock, SystemClock
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.objects import PodInfo
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


def connect_cluster(config: FleetConfig) -> tuple[ClusterReader | None, str]:
    """The cluster reader from ``agent.kubeconfig`` or the in-cluster account; (None, why) if neither works."""
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
        rt.stoppers.append(PodWatcher(cluster, node, ac.namespaces, rt.request_pass).start().stop)
    if broker_url is not None:
        client = redis_client(broker_url, config.broker, socket_timeout=5, socket_connect_timeout=5)
        rt.stoppers.append(Heartbeat(client, node, config.beat.reconcile_interval_s, clock).start().stop)
    address, port = probe if probe is not None else endpoint(config)
    if port:
        rt.stoppers.append(ProbeServer(address, port, rt.readiness, metrics.registry).start().stop)
    return rt
