"""Redis crashed (SIGKILL) and restarted with its data in the middle of the fleet's work: real
worker and agent processes, the loopback API server and loopback frontends.

* During a reconcile fan-out: the agents reconnect by themselves, and the next fan-out runs each
  node's pass (at most one pass per fan-out sent: nothing is run twice by the crash).
* During a retune sweep: the window is decided exactly once (no window lost, none applied twice),
  by the tick that harvests the sweep once its deadline has passed; later ticks, even with the
  clock stepped back, launch nothing for it again. Workers read time from a clock file.

Redis here persists every write (append-only file, as the chart's persistent Redis); what a
Redis without persistence loses is in docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.broker.embedded import free_loopback_port
from powerfleet.clock import FileClock
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config import load_config
from powerfleet.retune.fanin import FanIn
from powerfleet.tasks.fleet import fan_out
from powerfleet.testing.failover import node_pod, state_of, tick_passes
from powerfleet.testing.redisproc import CrashableRedis
from powerfleet.testing.retune_world import (
    BASE_K,
    GRID,
    INTERVAL,
    World,
    start_of,
    traffic_lines,
    write_segments,
)
from powerfleet.testing.waiting import wait_for, wait_worker
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher
from tests.agent.conftest import device

pytestmark = pytest.mark.integration
NODES = ("gpu-node-r", "gpu-node-s")


def test_agents_resume_after_a_redis_crash_mid_fan_out_and_each_node_pass_runs(tmp_path: Path) -> None:
    with ApiServer() as api, CrashableRedis(tmp_path / "redis") as broker:
        uids = {n: f"{i:08d}-0000-4000-8000-000000000000" for i, n in enumerate(NODES)}
        env = {"POWERFLEET_BROKER__URL": broker.url, "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "60",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp_path / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
               "POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state"), "POWERFLEET_AGENT__NAMESPACES": "[llm]"}
        ports = {n: free_loopback_port() for n in NODES}
        gpus = {}
        with Launcher(log_dir=tmp_path / "logs", env=dict(env)) as launcher:
            agents = {}
            for node in NODES:
                api.apply(node_pod(node, uids[node]))
                write_proc_entry(tmp_path / "proc" / node, 4242, uids[node])
                gpus[node] = SimulatedGpus.shared(tmp_path / "sim" / f"{node}.json", [device(0, pids=[4242])])
                agents[node] = launcher.spawn(node, "agent", "--node", node, env={
                    "POWERFLEET_AGENT__PROC_ROOT": str(tmp_path / "proc" / node),
                    "POWERFLEET_AGENT__PROBE_PORT": str(ports[node])})
            app = create_app(load_config(environ=env))
            for node in NODES:
                wait_worker(app, f"agent@{node}")
                wait_for(lambda n=node: gpus[n].read_limit(0) == 320_000, f"{node}'s first pass")
            before = {n: tick_passes(ports[n]) for n in NODES}

            fan_out(app, list(NODES), expires=60)
            broker.crash()  # in the middle: some passes may have been taken, some still queued
            broker.start()
            for node in NODES:
                wait_worker(app, f"agent@{node}", timeout_s=90)  # each agent reconnected by itself
            fan_out(app, list(NODES), expires=60)
            r = redis.Redis.from_url(broker.url)
            for node in NODES:
                wait_for(lambda n=node: tick_passes(ports[n]) >= before[n] + 1, f"{node}'s pass after the restart", 60)
            wait_for(lambda: all(r.llen(f"node.{n}") == 0 for n in NODES), "every node queue drained", 60)
            for node in NODES:
                ran = tick_passes(ports[node]) - before[node]
                assert 1 <= ran <= 2, (node, ran)  # at most one pass per fan-out: none run twice
                assert agents[node].proc.poll() is None
                assert gpus[node].read_limit(0) == 320_000


@pytest.fixture
def sweep_fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with ApiServer() as api, CrashableRedis(tmp_path / "redis") as broker:
        (tmp_path / "traces").mkdir()
        world = World(api, tmp_path / "traces", api.write_kubeconfig(tmp_path / "kubeconfig"))
        world.add_deployment("llama")
        clock = FileClock(str(tmp_path / "now"))
        clock.set(start_of(BASE_K) + 1)
        config = {"broker": {"url": broker.url}, "clock_file": clock.path,
                  "retune": {"deployments": ["llama"], "window_interval_s": INTERVAL,
                             "trace_dir": str(world.trace_dir), "kubeconfig": str(world.kubeconfig), "grid": GRID,
                             "objective": "ttft", "min_improvement_percentage": 0.0, "max_shards": 2,
                             "min_requests": 0, "confidence": 0.0, "dwell_s": 0, "search_rounds": 0,
                             "time_budget_s": 50, "shard_timeout_s": 40, "lease_duration_s": 30, "lease_renew_s": 5}}
        cfg_path = tmp_path / "fleet.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        app = create_app(load_config(cfg_path, environ={}))
        kube = KubeCluster.from_kubeconfig(str(world.kubeconfig))
        with Launcher(log_dir=tmp_path / "logs", env={"POWERFLEET_CONFIG": str(cfg_path)}) as launcher:
            launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@crash")
            launcher.spawn("sweep", "worker", "--queues", "sweep", "--name", "sweep@crash")
            wait_worker(app, "ctl@crash")
            wait_worker(app, "sweep@crash")
            try:
                yield {"world": world, "app": app, "kube": kube, "broker": broker, "clock": clock}
            finally:
                kube.close()
                world.stop()


def test_a_redis_crash_mid_sweep_loses_no_window_and_applies_none_twice(sweep_fleet: dict[str, Any]) -> None:
    world, app, kube, broker, clock = (sweep_fleet[k] for k in ("world", "app", "kube", "broker", "clock"))
    llama = world.frontends["llama"]
    k = BASE_K + 1

    def tick() -> dict[str, Any]:  # no "now": the worker reads the clock file
        return app.send_task("powerfleet.retune.tick", kwargs={}).get(timeout=90)

    assert tick()["launched"] == []  # enabled in window K
    write_segments(world.trace_dir, "llama", sorted(llama), traffic_lines(20000, start_of(k)), members=4)
    clock.set(start_of(k + 1) + 1)
    assert tick()["launched"] == [{"dgd": "llama", "window": k}]
    fan = FanIn(redis.Redis.from_url(broker.url))
    rec = wait_for(lambda: next(iter(fan.active("llama")), None), "the sweep record", 60)
    wait_for(lambda: fan.readers(rec.sid), "a shard reading the window", 60, every_s=0.005)

    broker.crash()  # mid-sweep: shards are running, the fan-in lives in the crashed Redis
    broker.start()
    wait_worker(app, "ctl@crash", timeout_s=90)
    wait_worker(app, "sweep@crash", timeout_s=90)
    # The retune ticks go on. A shard running at the crash can neither be acknowledged nor
    # cancelled, and its message does not come back within the time budget (docs/reliability.md),
    # so the tick after the sweep's deadline decides the window with the shards that arrived.
    clock.set(start_of(k + 1) + 1 + 50 + 1)
    after = tick()
    assert after["launched"] == [] and after["deployments"][0]["status"] == "leader", after
    st = wait_for(lambda: (s := state_of(kube)) is not None and s.last_window == k and s, "window k decided", 120)
    decided = [h for h in st.history if h.window == k]
    assert len(decided) == 1 and decided[0].outcome in ("apply", "keep", "abandoned"), st.history
    assert decided[0].outcome != "abandoned" or decided[0].failure_reason == "time-budget", decided[0]
    # The sweep is closed just after the decision is saved: late shards are dropped from then on.
    wait_for(lambda: fan.sweep(rec.sid).status in ("decided", "abandoned"), "the sweep closed", 60)

    # Later ticks, one with the clock stepped back into window k, never relaunch or re-decide it.
    writes = {pod: len(fe.writes) for pod, fe in llama.items()}
    for wall in (start_of(k) + 30, start_of(k + 1) + 59):
        clock.set(wall)
        assert tick()["launched"] == []
    st2 = state_of(kube)
    assert st2 is not None and [h.window for h in st2.history].count(k) == 1
    assert {pod: len(fe.writes) for pod, fe in llama.items()} == writes  # nothing applied again
    # at most one policy write per router (the leader's barrier PATCHes carry an empty policy)
    assert len([w for fe in llama.values() for w in fe.writes if w.policy_sent]) <= len(llama)
