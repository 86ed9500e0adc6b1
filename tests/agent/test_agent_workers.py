"""End to end with real parts: redis-server, two `powerfleet agent` worker processes for two nodes
with simulated GPUs, and the loopback Kubernetes API server reached through the official client."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery.exceptions import TimeoutError as CeleryTimeout

from powerfleet.agent.presence import live_agents
from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.config import load_config
from powerfleet.tasks.fleet import fan_out, tick_nodes
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import FleetCelery, create_app
from powerfleet.workers.launcher import Child, Launcher
from tests.agent.conftest import device
from tests.integration.conftest import broker_url, redis_server, wait_worker  # noqa: F401 - fixtures
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

NODES = ("gpu-node-a", "gpu-node-b")
UIDS = {"gpu-node-a": "aaaaaaaa-0000-4000-8000-00000000000a", "gpu-node-b": "bbbbbbbb-0000-4000-8000-00000000000b"}
CAPS = {"gpu-node-a": "300", "gpu-node-b": "450"}
GPU_OF = {"gpu-node-a": 0, "gpu-node-b": 1}  # which GPU each node's pod runs on
PID = 4242  # the same pid on both nodes: each agent must read its own node's /proc


def pod(node: str, cap: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"decode-{node}", "namespace": "llm", "uid": UIDS[node],
                         "annotations": {POWER_ANNOTATION: cap}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "m"}]},
            "status": {"phase": "Running"}}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Fleet:
    app: FleetCelery
    api: ApiServer
    gpus: dict[str, SimulatedGpus]
    ports: dict[str, int]
    agents: dict[str, Child]
    r: redis.Redis
    launcher: Launcher
    tmp: Path

    def respawn(self, node: str) -> Child:
        self.launcher.env["POWERFLEET_AGENT__PROC_ROOT"] = str(self.tmp / "proc" / node)
        self.launcher.env["POWERFLEET_AGENT__PROBE_PORT"] = str(self.ports[node])
        self.agents[node] = self.launcher.spawn(f"{node}-2", "agent", "--node", node)
        return self.agents[node]

    def metric(self, node: str, name: str, labels: str = "") -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.ports[node]}/metrics", timeout=5).read().decode()
        key = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    def limits(self, node: str) -> list[float]:
        return [d.current_w or 0 for d in self.gpus[node].devices()]


@pytest.fixture
def fleet(tmp_path: Path, broker_url: str) -> Iterator[Fleet]:  # noqa: F811
    with ApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        for node in NODES:
            api.apply(pod(node, CAPS[node]))
        env = {"POWERFLEET_BROKER__URL": broker_url, "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "60",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp_path / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(kubeconfig), "POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state"),
               "POWERFLEET_AGENT__NAMESPACES": "[llm]"}
        gpus = {n: SimulatedGpus.shared(tmp_path / "sim" / f"{n}.json", [device(0), device(1)]) for n in NODES}
        ports = {n: free_port() for n in NODES}
        with Launcher(log_dir=tmp_path / "logs", env=dict(env)) as launcher:
            agents = {}
            for node in NODES:
                write_proc_entry(tmp_path / "proc" / node, PID, UIDS[node])
                launcher.env["POWERFLEET_AGENT__PROC_ROOT"] = str(tmp_path / "proc" / node)
                launcher.env["POWERFLEET_AGENT__PROBE_PORT"] = str(ports[node])
                agents[node] = launcher.spawn(node, "agent", "--node", node)
            app = create_app(load_config(environ=env))
            for node in NODES:
                wait_worker(app, f"agent@{node}")
            r = redis.Redis.from_url(broker_url)
            fleet = Fleet(app, api, gpus, ports, agents, r, launcher, tmp_path)
            # The startup passes (the watch's first listing) find idle GPUs: nothing to set yet.
            for node in NODES:
                wait_for(lambda n=node: fleet.metric(n, "powerfleet_agent_passes_total", 'outcome="ok",trigger="watch"'),
                         f"{node}'s first watch pass")
            yield fleet
            for node in NODES:
                launcher.stop_child(fleet.agents[node])


def test_a_tick_reaches_both_agents_each_caps_only_its_own_gpus_and_the_watch_applies_a_change(fleet: Fleet) -> None:
    assert fleet.limits("gpu-node-a") == [700, 700] and fleet.limits("gpu-node-b") == [700, 700]
    # The serving processes start on their GPUs (no pod event: only a pass notices).
    for node in NODES:
        def start(devs, i=GPU_OF[node]) -> None:
            devs[i].pids = [PID]
        fleet.gpus[node].update(start)

    live = wait_for(lambda: live_agents(fleet.r) >= set(NODES) and live_agents(fleet.r), "both heartbeats")
    fan_out(fleet.app, tick_nodes([], live), expires=60)
    wait_for(lambda: fleet.limits("gpu-node-a") == [300, 700] and fleet.limits("gpu-node-b") == [700, 450],
             "each agent to cap its own pod's GPU")
    for node in NODES:  # the counter moves just after the limit: wait for it, then check it is exactly one
        wait_for(lambda n=node: fleet.metric(n, "powerfleet_agent_passes_total", 'outcome="ok",trigger="tick"'),
                 f"{node}'s tick pass to be counted")
        assert fleet.metric(node, "powerfleet_agent_passes_total", 'outcome="ok",trigger="tick"') == 1

    ready = urllib.request.urlopen(f"http://127.0.0.1:{fleet.ports['gpu-node-a']}/readyz", timeout=5)
    assert ready.status == 200 and ready.read().decode().startswith("ok last_good_pass_age_s=")

    # An annotation change on a running pod: live through the watch, long before the next tick (60 s).
    fleet.api.apply(pod("gpu-node-a", "250"))
    wait_for(lambda: fleet.limits("gpu-node-a") == [250, 700], "the watch to apply 250 W", timeout_s=30)
    assert fleet.limits("gpu-node-b") == [700, 450]
    assert fleet.metric("gpu-node-a", "powerfleet_agent_passes_total", 'outcome="ok",trigger="tick"') == 1

    # A DaemonSet-style restart (SIGTERM, then a new agent): the caps stay in force throughout.
    seen: list[list[float]] = []
    fleet.agents["gpu-node-a"].proc.send_signal(15)
    assert wait_for(lambda: seen.append(fleet.limits("gpu-node-a")) or fleet.agents["gpu-node-a"].proc.poll() is not None,
                    "the agent to exit", timeout_s=60)
    assert fleet.agents["gpu-node-a"].proc.returncode == 0
    assert fleet.limits("gpu-node-a") == [250, 700]
    assert "gpu-node-a" not in live_agents(fleet.r)
    log = fleet.agents["gpu-node-a"].log.read_text()
    assert "Traceback" not in log, log
    assert "keep their caps for the next agent" in log, log
    successor = fleet.respawn("gpu-node-a")
    wait_for(lambda: seen.append(fleet.limits("gpu-node-a")) or
             fleet.metric("gpu-node-a", "powerfleet_agent_passes_total", 'outcome="ok",trigger="watch"') >= 1,
             "the successor's first pass", timeout_s=60)
    assert all(x == [250, 700] for x in seen), seen  # never uncapped, not even for a moment
    assert "Traceback" not in successor.log.read_text()


def cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "powerfleet.cli", *args], capture_output=True, text=True,
                          timeout=120, env=fleet.launcher.child_env())


def test_one_agent_per_node_and_only_an_explicit_drain_restores_the_defaults(fleet: Fleet) -> None:
    node = "gpu-node-a"

    def start(devs) -> None:
        devs[0].pids = [PID]
    fleet.gpus[node].update(start)
    fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": node}).get(timeout=30)
    assert fleet.limits(node) == [300, 700]

    # A second agent for the node refuses to start, in one line, and touches nothing.
    second = cli(fleet, "agent", "--node", node, "--metrics-port", "0")
    assert second.returncode == 1, second.stderr
    assert second.stderr.strip().splitlines()[-1].startswith(f"powerfleet: error: another agent for node {node} is running")
    # So does a real `agent once`.
    once = cli(fleet, "agent", "once", "--node", node, "--proc-root", str(fleet.tmp / "proc" / node), "--json")
    assert once.returncode == 1 and "another agent for node" in once.stderr and "Traceback" not in once.stderr
    assert fleet.limits(node) == [300, 700]

    drained = cli(fleet, "agent", "drain", "--node", node, "--json", "--timeout", "60")
    assert drained.returncode == 0, drained.stderr + drained.stdout
    assert json.loads(drained.stdout)["restored"] == ["GPU-0000"]
    assert fleet.limits(node) == [700, 700]
    result = fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": node}).get(timeout=30)
    assert result["skipped"].startswith("drained") and fleet.limits(node) == [700, 700]

    assert cli(fleet, "agent", "drain", "--node", node, "--undo").returncode == 0
    wait_for(lambda: fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": node}).get(timeout=30)
             ["skipped"] is None, "the agent to notice the undo")
    assert fleet.limits(node) == [300, 700]
    # The other node meanwhile (same fleet, to spare a second start of two agents):
    evidence_reaches_redis_and_an_external_limit_change_is_corrected_within_one_pass(fleet)
    the_uninstall_drain_restores_every_live_node_until_its_ttl(fleet)


def the_uninstall_drain_restores_every_live_node_until_its_ttl(fleet: Fleet) -> None:
    """What the chart's pre-delete hook runs: `drain --all --ttl`."""
    assert fleet.limits("gpu-node-a") == [300, 700] and fleet.limits("gpu-node-b") == [700, 450]
    # The TTL must outlast the drain's own run and the checks below on a loaded machine (at 3 s it
    # ended before the limits were read); the wait for its end is derived from it.
    ttl_s = 20
    out = cli(fleet, "agent", "drain", "--all", "--json", "--timeout", "60", "--ttl", str(ttl_s))
    assert out.returncode == 0, out.stderr + out.stdout
    nodes = json.loads(out.stdout)["nodes"]
    assert set(nodes) == set(NODES) and all(a["answered"] and a["left"] == [] for a in nodes.values()), nodes
    assert (nodes["gpu-node-a"]["restored"], nodes["gpu-node-b"]["restored"]) == (["GPU-0000"], ["GPU-0001"])
    assert fleet.limits("gpu-node-a") == [700, 700] and fleet.limits("gpu-node-b") == [700, 700]
    # The requests end by themselves (a reinstall on the same Redis is not drained for good).
    for node in NODES:
        wait_for(lambda n=node: fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": n}).get(timeout=30)
                 ["skipped"] is None, f"{node}'s drain to end with its TTL", timeout_s=ttl_s + 60)
    assert fleet.limits("gpu-node-a") == [300, 700] and fleet.limits("gpu-node-b") == [700, 450]
    undo = cli(fleet, "agent", "drain", "--all", "--undo", "--json")
    assert undo.returncode == 0 and json.loads(undo.stdout) == {"nodes": {}}


def test_an_agent_runs_only_its_own_nodes_work_and_keeps_its_own_binding(fleet: Fleet) -> None:
    refuses_and_counts_another_nodes_pass_however_it_was_routed(fleet)
    restores_its_own_binding_after_flower_style_consumer_changes(fleet)


def refuses_and_counts_another_nodes_pass_however_it_was_routed(fleet: Fleet) -> None:
    result = fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": "gpu-node-a"}, queue="node.gpu-node-b")
    with pytest.raises(Exception) as err:
        result.get(timeout=30)
    assert not isinstance(err.value, CeleryTimeout)
    assert "refused by the agent of node 'gpu-node-b'" in str(err.value)
    assert fleet.metric("gpu-node-b", "powerfleet_agent_refused_tasks_total", 'reason="other_node"') == 1
    assert fleet.metric("gpu-node-b", "powerfleet_agent_passes_total", 'outcome="ok",trigger="tick"') == 0
    assert fleet.metric("gpu-node-a", "powerfleet_agent_passes_total", 'outcome="ok",trigger="tick"') == 0
    # Its own node's pass still runs there.
    ok = fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": "gpu-node-b"}).get(timeout=30)
    assert (ok["node"], ok["worker"], ok["queue"], ok["ran"]) == ("gpu-node-b", "agent@gpu-node-b", "node.gpu-node-b", True)


def active_queues(app: FleetCelery, worker: str) -> set[str]:
    reply = app.control.inspect(destination=[worker], timeout=2).active_queues() or {}
    return {q["name"] for q in reply.get(worker, [])}


def restores_its_own_binding_after_flower_style_consumer_changes(fleet: Fleet) -> None:
    worker, log = "agent@gpu-node-b", fleet.agents["gpu-node-b"].log
    restores = lambda: fleet.metric("gpu-node-b", "powerfleet_agent_binding_restores_total")  # noqa: E731
    fleet.app.control.cancel_consumer("node.gpu-node-b", destination=[worker], reply=True, timeout=5)
    # Wait on the counter, which moves after the repair, not on the queue list (seen before the log line).
    wait_for(lambda: restores() == 1, "the binding restored once", timeout_s=30)
    wait_for(lambda: active_queues(fleet.app, worker) == {"node.gpu-node-b"}, "its own queue back", timeout_s=30)
    fleet.app.control.add_consumer("control", destination=[worker], reply=True, timeout=5)
    wait_for(lambda: restores() == 2, "the binding restored a second time", timeout_s=30)
    wait_for(lambda: active_queues(fleet.app, worker) == {"node.gpu-node-b"}, "the foreign queue dropped", timeout_s=30)
    assert log.read_text().count("restoring the binding") == 2
    ok = fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": "gpu-node-b"}).get(timeout=30)
    assert ok["ran"] and ok["queue"] == "node.gpu-node-b"


def test_with_the_broker_down_the_agent_keeps_enforcing_and_exits_cleanly(tmp_path: Path) -> None:
    from powerfleet.broker.embedded import EmbeddedRedis

    node = "gpu-node-a"
    with ApiServer() as api, EmbeddedRedis() as broker:
        api.apply(pod(node, "300"))
        port = free_port()
        env = {"POWERFLEET_BROKER__URL": broker.url, "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "60",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp_path / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
               "POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state"), "POWERFLEET_AGENT__PROC_ROOT": str(tmp_path / "proc"),
               "POWERFLEET_AGENT__PROBE_PORT": str(port)}
        write_proc_entry(tmp_path / "proc", PID, UIDS[node])
        gpus = SimulatedGpus.shared(tmp_path / "sim" / f"{node}.json", [device(0, pids=[PID]), device(1)])
        with Launcher(log_dir=tmp_path / "logs", env=env) as launcher:
            agent = launcher.spawn(node, "agent", "--node", node)
            wait_for(lambda: gpus.read_limit(0) == 300_000, "the first (watch) pass to cap GPU 0")
            broker.stop()  # Redis gone: no ticks, no heartbeat
            api.apply(pod(node, "275"))
            wait_for(lambda: gpus.read_limit(0) == 275_000, "the watch to apply 275 W without a broker")
            assert agent.proc.poll() is None  # a broker outage never ends the agent
            agent.proc.send_signal(15)
            assert agent.proc.wait(timeout=60) == 0
            assert gpus.read_limit(0) == 275_000  # a stop is no drain: the cap stays for the next agent
            log = agent.log.read_text()
            assert "Traceback" not in log, log


def evidence_reaches_redis_and_an_external_limit_change_is_corrected_within_one_pass(fleet: Fleet) -> None:
    from powerfleet.agent.evidence import evidence_key

    node = "gpu-node-b"

    def start(devs) -> None:
        devs[1].pids = [PID]
    fleet.gpus[node].update(start)
    fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": node}).get(timeout=30)
    assert fleet.limits(node) == [700, 450]

    def record() -> dict | None:
        raw = fleet.r.hget(evidence_key(node), "GPU-0001")
        return json.loads(raw) if raw else None
    got = wait_for(lambda: (r := record()) and r["target_w"] == 450 and r, "the evidence of the capped GPU")
    # Dynamo's report on the pod, by the agent worker with its default config (the annotation is on).
    from powerfleet.agent.annotate import REPORT_ANNOTATION

    def report() -> dict | None:
        raw = (fleet.api.get("v1", "Pod", f"decode-{node}", "llm")["metadata"].get("annotations") or {}).get(
            REPORT_ANNOTATION)
        return json.loads(raw) if raw else None
    on_pod = wait_for(lambda: (r := report()) and r["gpus"][0]["targetWatts"] == 450 and r, "the report on the pod")
    assert (on_pod["version"], on_pod["podUID"], on_pod["node"]) == (1, UIDS[node], node)
    assert (on_pod["gpus"][0]["uuid"], on_pod["gpus"][0]["enforcedCapWatts"]) == ("GPU-0001", 450)
    assert (got["enforced_w"], got["write"], got["readback"], got["pods"][0]["name"]) == (450, "ok", "match", f"decode-{node}")
    assert 0 < fleet.r.ttl(evidence_key(node)) <= 180  # three 60 s intervals

    def nvidia_smi_pl(devs) -> None:
        devs[1].current_w = 650
    fleet.gpus[node].update(nvidia_smi_pl)
    fleet.app.send_task("powerfleet.agent.reconcile", kwargs={"node": node}).get(timeout=30)
    assert fleet.limits(node) == [700, 450]  # corrected in that one pass
    assert fleet.metric(node, "powerfleet_agent_readback_mismatch_total") == 1
