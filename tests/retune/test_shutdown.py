"""A stopping worker gives its Leases up when the stop begins (issue 33 item 7).

The fleet's default worker consumes ``control`` and ``sweep`` (``powerfleet worker``, ``up``), so
the worker that leads may be running a long sweep shard when it is told to stop; Celery's warm
shutdown waits for that shard, a pod's grace period ends first, and the SIGKILL used to leave
every Lease held for ``lease_duration_s`` (no retune anywhere meanwhile). Real Redis, one real
worker process with two prefork children, the loopback API server and frontends.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml

from powerfleet.clock import FakeClock
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config import load_config
from powerfleet.retune.fanin import FanIn, sweep_id
from powerfleet.retune.leadership import Leadership, leader_lease_name
from powerfleet.retune.settings import resolve
from powerfleet.testing.retune_world import (BASE_K, World, live_retune_section, start_of, traffic_lines,
                                            write_segments)
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import create_app
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
NAME = "fleet@stop"
DGDS = ("llama", "mistral")
# The stop's budget: a pod's grace period (Kubernetes' default is 30 s). The Leases must be
# free well inside it, however long the shard being drained runs.
GRACE_S = 30.0
HEAVY = 40_000  # requests in the swept window: its shards outlast the grace period on 2 cores


@pytest.fixture
def fleet(tmp_path: Any, redis_url: str) -> Iterator[dict[str, Any]]:
    redis.Redis.from_url(redis_url).flushall()
    with ApiServer() as api:
        (tmp_path / "traces").mkdir()
        world = World(api, tmp_path / "traces", api.write_kubeconfig(tmp_path / "kubeconfig"))
        for d in DGDS:
            world.add_deployment(d)
        config = {"broker": {"url": redis_url},
                  "retune": live_retune_section(world, list(DGDS))}
        cfg_path = tmp_path / "fleet.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        app = create_app(load_config(cfg_path, environ={}))
        kube = KubeCluster.from_kubeconfig(str(world.kubeconfig))
        with Launcher(log_dir=tmp_path / "logs", env={"POWERFLEET_CONFIG": str(cfg_path)}) as launcher:
            worker = launcher.spawn("worker", "worker", "--queues", "control,sweep", "--concurrency", "2",
                                    "--name", NAME)
            wait_worker(app, NAME)
            try:
                yield {"world": world, "app": app, "kube": kube, "r": redis.Redis.from_url(redis_url),
                       "worker": worker, "launcher": launcher, "config": load_config(cfg_path, environ={})}
            finally:
                kube.close()
                world.stop()


def holders(kube: KubeCluster) -> dict[str, str | None]:
    return {d: kube.get_lease("default", leader_lease_name(d)).holder_identity for d in DGDS}


def test_a_worker_stopped_while_draining_a_shard_whose_first_run_was_killed_frees_every_lease(
        fleet: dict[str, Any]) -> None:
    world, app, kube, r = fleet["world"], fleet["app"], fleet["kube"], fleet["r"]
    k = BASE_K + 1

    def tick(now: float) -> dict[str, Any]:
        return app.send_task("powerfleet.retune.tick", kwargs={"now": now}).get(timeout=60)

    tick(start_of(k - 1) + 1)  # enables retune during window k - 1 (skipped); k is the first swept
    pods = sorted(world.frontends["llama"])
    write_segments(world.trace_dir, "llama", pods, traffic_lines(HEAVY, start_of(k)), members=4, tag="heavy")
    launched = tick(start_of(k + 1) + 1)
    assert {"dgd": "llama", "window": k} in launched["launched"], launched
    assert holders(kube) == {d: NAME for d in DGDS}, holders(kube)
    term = next(d["term"] for d in launched["deployments"] if d["deployment"] == "llama")
    sid = sweep_id("llama", k, resolve(fleet["config"].retune, "llama").generation, term)
    fan = FanIn(r)
    rec = wait_for(lambda: fan.sweep(sid), "the sweep record", 60)
    grid_keys = {sh.key() for sh in rec.shards[1:]}

    def reading() -> tuple[str, int] | None:
        for key, who in fan.readers(sid).items():
            pid = int(who.rsplit(":", 1)[1])
            if key in grid_keys and fan.result(key) is None:
                return key, pid
        return None

    key, pid = wait_for(reading, "a grid shard reading the window", 120, every_s=0.005)
    assert pid != fleet["worker"].proc.pid  # a prefork child
    os.kill(pid, signal.SIGKILL)
    # task_retry_on_worker_lost: the same shard runs again 1 s later in a new child.
    wait_for(lambda: reading() is not None and reading()[1] != pid, "a grid shard running in another child", 120,
             every_s=0.01)
    assert fan.sweep(sid).status == "running"

    fleet["worker"].proc.send_signal(signal.SIGTERM)  # warm shutdown: the shards running are drained
    stopped_at = time.monotonic()
    wait_for(lambda: all(h is None for h in holders(kube).values()), "every Lease released after SIGTERM", GRACE_S)
    released_s = time.monotonic() - stopped_at
    # Released as the stop began, not when the drain ended: a drained shard had not finished.
    unfinished = [kk for kk in grid_keys if fan.result(kk) is None]
    assert unfinished and fleet["worker"].proc.poll() is None, (
        f"the Leases were released {released_s:.1f} s after SIGTERM, once the drain had ended")
    # The grace period ends: the process and its children go (SIGKILL), however far the drain got.
    fleet["launcher"].stop_child(fleet["worker"], timeout_s=max(0.1, GRACE_S - released_s))
    assert holders(kube) == {d: None for d in DGDS}, f"a running task re-claimed a Lease: {holders(kube)}"


def test_a_claim_that_lands_as_the_stop_begins_is_given_back(kube: KubeCluster) -> None:
    """The handshake: the stop marks, then releases; a claim writes, then checks the mark. A
    claim whose write the stop's release did not see finds the mark and gives the Lease back."""
    def holder() -> str | None:
        return kube.get_lease("default", leader_lease_name("llama")).holder_identity

    lead = Leadership(kube, "default", "llama", "other@x", duration_s=30, clock=FakeClock())
    t, _, acquired = lead.claim()
    assert t is not None and acquired and holder() == "other@x", (t, holder())
    assert lead.release() and holder() is None

    checks = iter([False, True])  # not stopping at the first check, stopping by the second
    lead.stopping = lambda: next(checks)
    assert lead.claim() == (None, "other@x (stopping)", False)
    assert holder() is None, holder()
    lead.stopping = lambda: True  # stopping before the claim: it writes nothing
    assert lead.claim() == (None, "other@x (stopping)", False)
    assert holder() is None, holder()
