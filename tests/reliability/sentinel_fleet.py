"""The fleet on the session's Sentinel cluster (tests/reliability/conftest.py), started once for
tests/reliability/test_sentinel_failover.py, every process at once:

* on database 0: beat (ticks every second), a control+sweep worker, one agent per node of
  NODES (simulated GPUs, a pod each on the loopback API server, namespace ``llm``) and the
  budget of one power-aware deployment, ``default/alpha`` (pods on a node without an agent);
* on database 1: a retune worker (control+sweep) for deployment ``llama`` (two loopback
  frontends, trace segments), reading time from a clock file the test moves. No beat there:
  the test sends its ticks.

Both read the same loopback API server (``HookedApiServer``: a test can act at a chosen request).
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.beat.ticklog import TickLog
from powerfleet.broker.clients import redis_client
from powerfleet.broker.embedded import free_loopback_port
from powerfleet.clock import FileClock
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config import load_config
from powerfleet.retune.fanin import FanIn
from powerfleet.testing.api_faults import HookedApiServer
from powerfleet.testing.failover import node_pod, retune_config, tick_passes
from powerfleet.testing.retune_world import BASE_K, World, start_of
from powerfleet.testing.sentinels import SentinelCluster
from powerfleet.testing.waiting import wait_for, wait_worker
from powerfleet.workers.app import TICK_FAMILIES, FleetCelery, create_app
from powerfleet.workers.launcher import Launcher
from tests.agent.conftest import device
from powerfleet.testing.budget.stand_in_operator import dgd, settle

NODES = ("gpu-node-h", "gpu-node-i")
ALPHA = "default/alpha"  # the power-aware deployment
BUDGET_NODES = ["gpu-node-b"]


@dataclass
class Retune:
    app: FleetCelery
    world: World
    clock: FileClock
    fan: FanIn
    enabled: Any  # the first tick's AsyncResult, sent at start-up: it enables retune in window BASE_K
    worker: str = "retune@sentinel"


@dataclass
class Fleet:
    cluster: SentinelCluster
    api: HookedApiServer
    kube: KubeCluster
    launcher: Launcher
    app: FleetCelery
    ticks: TickLog
    probe_ports: dict[str, int]
    env: dict[str, str]
    retune: Retune


@contextmanager
def running_fleet(cluster: SentinelCluster, tmp: Path) -> Iterator[Fleet]:
    cluster.restore()
    with HookedApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        kube = KubeCluster.from_kubeconfig(str(kubeconfig))
        api.apply(dgd("alpha", 1, 1))
        settle(api, kube, "alpha", BUDGET_NODES)
        (tmp / "traces").mkdir()
        world = World(api, tmp / "traces", kubeconfig)
        world.add_deployment("llama")
        clock = FileClock(str(tmp / "now"))
        clock.set(start_of(BASE_K) + 1)
        retune_cfg = retune_config(cluster, world, clock, tmp / "retune.yaml")
        env = {**cluster.env(), "POWERFLEET_NODES": f"[{', '.join(NODES)}]",
               "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_BEAT__BUDGET_INTERVAL_S": "1",
               "POWERFLEET_BEAT__RETUNE_INTERVAL_S": "1", "POWERFLEET_BEAT__LOCK_TIMEOUT_S": "5",
               "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "1",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(kubeconfig),
               "POWERFLEET_AGENT__STATE_DIR": str(tmp / "state"), "POWERFLEET_AGENT__NAMESPACES": "[llm]",
               "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
               "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({ALPHA: {"power_limit_w": 4000}})}
        ports = {n: free_loopback_port() for n in NODES}
        # No fleet-wide variables: the retune worker's configuration is its file alone.
        with Launcher(log_dir=tmp / "logs") as launcher:
            try:
                for i, node in enumerate(NODES):
                    uid = f"{i:08d}-0000-4000-8000-00000000000{i}"
                    api.apply(node_pod(node, uid))
                    write_proc_entry(tmp / "proc" / node, 4242, uid)
                    SimulatedGpus.shared(tmp / "sim" / f"{node}.json", [device(0, pids=[4242])])
                    launcher.spawn(node, "agent", "--node", node, env={
                        **env, "POWERFLEET_AGENT__PROC_ROOT": str(tmp / "proc" / node),
                        "POWERFLEET_AGENT__PROBE_PORT": str(ports[node])})
                launcher.spawn("ctl", "worker", "--queues", "control,sweep", "--name", "ctl@sentinel", env=env)
                launcher.spawn("retune", "worker", "--queues", "control,sweep", "--name", "retune@sentinel",
                               "--concurrency", "3", env={"POWERFLEET_CONFIG": str(retune_cfg)})
                app = create_app(load_config(environ=env))
                rapp = create_app(load_config(retune_cfg, environ={}))
                for name in ("ctl@sentinel", *(f"agent@{n}" for n in NODES)):
                    wait_worker(app, name, timeout_s=90)
                launcher.spawn("beat", "beat", env=env)
                wait_worker(rapp, "retune@sentinel", timeout_s=90)
                ticks = TickLog(redis_client(cluster.url, app.fleet_config.broker, socket_timeout=2))
                fan = FanIn(redis_client(rapp.conf.broker_url, rapp.fleet_config.broker, socket_timeout=5))
                # The first tick (a fresh worker's slowest) runs while the other tests do.
                enabled = rapp.send_task("powerfleet.retune.tick", kwargs={})
                yield Fleet(cluster, api, kube, launcher, app, ticks, ports, env,
                            Retune(rapp, world, clock, fan, enabled))
            finally:
                # The processes' graceful stops prove nothing here and took seconds each.
                for child in list(launcher.children):
                    if child.proc.poll() is None:
                        os.killpg(child.proc.pid, signal.SIGKILL)
                kube.close()
                world.stop()


def carries_on(fleet: Fleet, since: float) -> None:
    """After a promotion at ``since``: each family ticks, each node passes, nobody died."""
    passes = {n: tick_passes(fleet.probe_ports[n]) for n in NODES}
    for family in TICK_FAMILIES:
        wait_for(lambda f=family: fleet.ticks.last_ticks().get(f, 0) > since,
                 f"a {family} tick after the promotion (beat leading again)", 60, every_s=0.2)
    for node in NODES:
        wait_for(lambda n=node: tick_passes(fleet.probe_ports[n]) > passes[n],
                 f"a reconcile pass on {node} after the promotion", 60, every_s=0.2)
    assert fleet.launcher.dead_children() == []


def reconnects(port: int, kind: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    key = f'powerfleet_broker_reconnects_total{{kind="{kind}"}} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(key)), -1.0)


def _log(fleet: Fleet, child: str) -> Path:
    return next(c for c in fleet.launcher.children if c.name == child).log


def log_size(fleet: Fleet, child: str) -> int:
    """Where ``child``'s log ends now (bytes): a later ``log_since`` shows what came after."""
    return _log(fleet, child).stat().st_size


def log_since(fleet: Fleet, child: str, offset: int, lines: int = 60) -> str:
    """``child``'s log lines after ``offset`` without traceback bodies or the frontends' HTTP lines
    (its last ``lines``): what a failed wait puts in its message, since CI keeps no tmp dir."""
    with open(_log(fleet, child), "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    kept = [line for line in text.splitlines()
            if (line.startswith("[") and "HTTP Request:" not in line) or line.startswith("redis.exceptions")]
    return "\n".join(kept[-lines:])
