"""Beat killed with SIGKILL (no lock release) while a standby waits, then restarted: every retune
window is launched and decided exactly once, whichever beat sent the tick.

Real beat and worker processes, real Redis, the loopback API server and frontends. Beats tick
every second on the real clock; the windows come from the clock file the worker reads, so the
test chooses when each window closes. tests/integration/test_beat.py covers the graceful case
(SIGTERM) and the single sender of reconcile ticks.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import redis
import yaml

from powerfleet.beat.ticklog import TickLog
from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.clock import FileClock
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config import load_config
from powerfleet.retune.leadership import STATE_ANNOTATION, state_lease_name
from powerfleet.retune.state import parse_state
from powerfleet.testing.retune_world import BASE_K, GRID, INTERVAL, World, start_of
from powerfleet.testing.waiting import wait_for, wait_worker
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher

pytestmark = pytest.mark.integration
K = BASE_K


def sender_pid(origin: str) -> int:
    match = re.match(r"^(?:gen)?(\d+)@", origin)
    assert match, origin
    return int(match.group(1))


def test_a_killed_beat_is_replaced_and_no_window_is_launched_twice(tmp_path: Path) -> None:
    with ApiServer() as api, EmbeddedRedis() as broker:
        (tmp_path / "traces").mkdir()
        world = World(api, tmp_path / "traces", api.write_kubeconfig(tmp_path / "kubeconfig"))
        world.add_deployment("llama")
        clock = FileClock(str(tmp_path / "now"))
        clock.set(start_of(K) + 1)
        config = {"broker": {"url": broker.url}, "clock_file": clock.path, "nodes": [],
                  "beat": {"retune_interval_s": 1, "reconcile_interval_s": 3600, "budget_interval_s": 3600,
                           "lock_timeout_s": 5, "max_loop_interval_s": 1},
                  "retune": {"deployments": ["llama"], "window_interval_s": INTERVAL, "grid": GRID,
                             "trace_dir": str(world.trace_dir), "kubeconfig": str(world.kubeconfig),
                             "time_budget_s": 50, "shard_timeout_s": 40, "lease_duration_s": 30, "lease_renew_s": 5}}
        cfg_path = tmp_path / "fleet.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        app = create_app(load_config(cfg_path, environ={}))
        kube = KubeCluster.from_kubeconfig(str(world.kubeconfig))
        ticks = TickLog(redis.Redis.from_url(broker.url))

        def history() -> list[int]:
            lease = kube.get_lease("default", state_lease_name("llama"))
            st = parse_state(lease.annotations.get(STATE_ANNOTATION))
            return [] if st is None else [h.window for h in st.history]

        def decided(k: int) -> bool:  # wait_for retries while the state Lease does not exist yet
            return k in history()

        try:
            with Launcher(log_dir=tmp_path / "logs", env={"POWERFLEET_CONFIG": str(cfg_path)}) as launcher:
                launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@beat")
                wait_worker(app, "ctl@beat")
                beats = [launcher.spawn("beat", "beat"), launcher.spawn("beat2", "beat")]
                wait_for(lambda: ticks.counts().get("retune", 0) >= 2, "retune ticks from the leading beat", 60)
                clock.set(start_of(K + 2) + 1)  # window K+1 closes (K, in progress at enable, is skipped)
                wait_for(lambda: decided(K + 1), "window K+1 decided", 60)

                leader_pid = sender_pid(ticks.origins("retune")[0])
                leader = next(b for b in beats if b.proc.pid == leader_pid)
                standby = next(b for b in beats if b is not leader)
                leader.proc.send_signal(signal.SIGKILL)  # the RedBeat lock is left to expire
                leader.proc.wait(timeout=30)
                clock.set(start_of(K + 3) + 1)
                wait_for(lambda: decided(K + 2), "window K+2 decided after the standby took over", 60)
                wait_for(lambda: sender_pid(ticks.origins("retune")[0]) == standby.proc.pid,
                         "the standby to send the ticks", 60)

                launcher.children.remove(leader)
                restarted = launcher.spawn("beat3", "beat")  # comes back as the standby
                clock.set(start_of(K + 4) + 1)
                wait_for(lambda: decided(K + 3), "window K+3 decided", 60)
                for _ in range(3):  # more ticks at the same instant change nothing
                    before = ticks.counts()["retune"]
                    wait_for(lambda b=before: ticks.counts()["retune"] > b, "another retune tick", 30)
                assert history() == [K + 1, K + 2, K + 3]  # each window decided exactly once
                senders = {sender_pid(o) for o in ticks.origins("retune")}
                assert restarted.proc.pid not in senders and restarted.proc.poll() is None  # waiting on the lock
                assert {leader_pid, standby.proc.pid} <= senders
        finally:
            kube.close()
            world.stop()
