"""What the failover tests (tests/reliability/) and bench/failover.py share, besides the
Sentinel cluster itself (``sentinels.py``): a node's GPU pod and the agent's pass counter, the
retune configuration on a Sentinel cluster's database, and the retune state a window left."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.retune.leadership import STATE_ANNOTATION, state_lease_name
from powerfleet.retune.state import RetuneState, parse_state
from powerfleet.testing.retune_world import GRID, INTERVAL

if TYPE_CHECKING:
    from powerfleet.clock import FileClock
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.testing.retune_world import World
    from powerfleet.testing.sentinels import SentinelCluster

RETUNE_DB = 1
RETUNE_BUDGET_S = 50  # a sweep's time budget, on the clock file


def node_pod(node: str, uid: str, cap_w: int = 320) -> dict[str, Any]:
    """A running pod on ``node`` in namespace ``llm`` whose GPUs are capped at ``cap_w``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"decode-{node}", "namespace": "llm", "uid": uid,
                         "annotations": {POWER_ANNOTATION: str(cap_w)}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "m"}]}, "status": {"phase": "Running"}}


def sim_device(index: int, pids: list[int]) -> dict[str, Any]:
    """A simulated H200-like GPU (200-700 W, at 700 W) running ``pids``."""
    return {"index": index, "uuid": f"GPU-{index:04d}", "min_w": 200, "max_w": 700, "default_w": 700,
            "current_w": 700, "pids": pids}


def tick_passes(port: int) -> float:
    """The agent's successful tick passes, from its probe's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    key = 'powerfleet_agent_passes_total{outcome="ok",trigger="tick"} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(key)), 0.0)


def retune_config(cluster: SentinelCluster, world: World, clock: FileClock, path: Path, db: int = RETUNE_DB) -> Path:
    """A fleet.yaml retuning ``llama`` of ``world`` on the cluster's database ``db``, time from ``clock``."""
    config = {"broker": cluster.broker_config(db), "clock_file": clock.path,
              "retune": {"deployments": ["llama"], "window_interval_s": INTERVAL, "trace_dir": str(world.trace_dir),
                         "kubeconfig": str(world.kubeconfig), "grid": GRID, "objective": "ttft",
                         "min_improvement_percentage": 0.0, "max_shards": 2, "min_requests": 0, "confidence": 0.0,
                         "dwell_s": 0, "search_rounds": 0, "time_budget_s": RETUNE_BUDGET_S,
                         "shard_timeout_s": 40, "lease_duration_s": 30, "lease_renew_s": 5}}
    path.write_text(yaml.safe_dump(config))  # the password in a file the caller owns, not in argv
    return path


def state_of(kube: KubeCluster) -> RetuneState | None:
    """The retune state ``llama``'s state Lease holds (None before its first window)."""
    return parse_state(kube.get_lease("default", state_lease_name("llama")).annotations.get(STATE_ANNOTATION))
