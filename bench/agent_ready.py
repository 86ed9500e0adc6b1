"""(f) of bench/agent.py: an annotated pod's Ready flip -> its idle, PodResources-allocated GPU capped.

Each round a new annotated pod (Running, not Ready, not yet allocated) is added on the loopback
API server and its pass runs; then the twin's PodResources server starts listing GPU 0 for it
and the pod turns Ready; the time is taken from that status write to the new cap read back on
the simulated GPU. No tick, no local timer, no process poll: only the watch event's pass (after
its 0.05 s debounce) can set it. The previous round's pod is deleted first (an idle GPU keeps its
cap, so each round's cap is distinct).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.podcache import PodCache
from powerfleet.agent.podresources import PodResourcesClient
from powerfleet.agent.reconcile import NodeAgent
from powerfleet.agent.runtime import AgentRuntime
from powerfleet.agent.simulated import SimulatedGpus
from powerfleet.agent.state import StateStore
from powerfleet.clock import SystemClock
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.gpus.podresources import PodResourcesServers


def _pod(k: int, cap: int, ready: bool) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"decode-{k}", "namespace": "llm", "annotations": {POWER_ANNOTATION: str(cap)}},
            "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "image": "m"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _wait(probe: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError("bench: condition not reached")
        time.sleep(0.002)


def bench_ready(changes: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-f-"))
    (tmp / "proc" / "1").mkdir(parents=True)
    (tmp / "proc" / "1" / "cgroup").write_text("0::/init.scope\n")
    gpus = SimulatedGpus.shared(tmp / "gpus.json", [{"index": 0, "uuid": "GPU-0000", "min_w": 200, "max_w": 700,
                                                     "default_w": 700, "pids": []}])
    allocated: list[dict[str, Any]] = []
    servers = PodResourcesServers(["gpu-0"], lambda: list(allocated), lambda p: [0], lambda n, g: f"GPU-{g:04d}").start()
    metrics = AgentMetrics(CollectorRegistry())

    def watch_passes() -> float:
        return metrics.value("powerfleet_agent_passes_total", {"trigger": "watch", "outcome": "ok"})

    lat: list[float] = []
    with ApiServer() as api:
        cluster = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp / "kubeconfig")))
        kicks: list[Any] = []
        cache = PodCache(cluster, "gpu-0", ["llm"], lambda reason: [k(reason) for k in kicks])
        agent = NodeAgent("gpu-0", open_gpus=lambda: SimulatedGpus.shared(tmp / "gpus.json"),
                          list_pods=cache.snapshot, proc_root=tmp / "proc", complete_view=False,
                          state=StateStore(tmp / "state"), clock=SystemClock(), metrics=metrics,
                          allocations=PodResourcesClient(str(servers.sockets["gpu-0"])).list)
        rt = AgentRuntime(agent, interval_s=3600)  # no tick, no timer pass, no process poll
        kicks.append(rt.request_pass)
        rt.stoppers.append(cache.start().stop)
        rt.start()
        _wait(lambda: watch_passes() >= 1)
        for k in range(changes):
            cap = 300 + 5 * k
            if k:
                allocated.clear()
                api.delete("v1", "Pod", f"decode-{k - 1}", "llm")
            done = watch_passes()
            api.apply(_pod(k, cap, ready=False))
            _wait(lambda d=done: watch_passes() >= d + 1)  # its "added" pass: nothing allocated yet
            time.sleep(0.3)  # past the debounce window, so the flip gets a pass of its own
            allocated.append(_pod(k, cap, ready=True))
            t0 = time.perf_counter()
            api.apply(_pod(k, cap, ready=True))
            _wait(lambda c=cap: gpus.read_limit(0) == c * 1000)
            lat.append(time.perf_counter() - t0)
        rt.stop()
        cluster.close()
    servers.stop()
    return {"median_s": statistics.median(lat), "max_s": max(lat), "changes": len(lat)}
