"""Live retune end to end: real Redis, real control and sweep worker processes, the loopback
API server and loopback frontends. Windows are driven by ``retune.tick`` with an explicit
``now`` (no sleeps, no wall-clock windows); every wait is on a state with a deadline.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml

from powerfleet.cluster.kube import KubeCluster
from powerfleet.config import load_config
from powerfleet.retune.fanin import FanIn, sweep_id
from powerfleet.retune.leadership import STATE_ANNOTATION, leader_lease_name, state_lease_name
from powerfleet.retune.settings import resolve
from powerfleet.retune.state import RetuneState, parse_state
from powerfleet.retune.windows import dedupe_key
from powerfleet.testing.retune_world import BASE_K, World, live_retune_section, start_of, traffic_lines, write_segments
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import FleetCelery, create_app
from powerfleet.workers.launcher import Launcher
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
K = BASE_K


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("live")
    redis.Redis.from_url(redis_url).flushall()
    with ApiServer() as api:
        (tmp / "traces").mkdir()
        world = World(api, tmp / "traces", api.write_kubeconfig(tmp / "kubeconfig"))
        world.add_deployment("llama")
        world.add_deployment("adv")
        config = {"broker": {"url": redis_url},
                  "retune": live_retune_section(world, ["llama", "adv"], per_deployment={"adv": {"mode": "advisory"}})}
        cfg_path = tmp / "fleet.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        env = {"POWERFLEET_CONFIG": str(cfg_path)}
        app = create_app(load_config(cfg_path, environ={}))
        kube = KubeCluster.from_kubeconfig(str(world.kubeconfig))
        with Launcher(log_dir=tmp / "logs", env=env) as launcher:
            ctl = launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@retune")
            sweep = launcher.spawn("sweep", "worker", "--queues", "sweep", "--name", "sweep@retune")
            wait_worker(app, "ctl@retune")
            wait_worker(app, "sweep@retune")
            try:
                yield {"world": world, "app": app, "kube": kube, "r": redis.Redis.from_url(redis_url),
                       "sweep": sweep, "ctl": ctl, "launcher": launcher,
                       "config": load_config(cfg_path, environ={})}
            finally:
                kube.close()
                world.stop()


def tick(app: FleetCelery, now: float) -> dict[str, Any]:
    return app.send_task("powerfleet.retune.tick", kwargs={"now": now}).get(timeout=60)


def state_of(kube: KubeCluster, dgd: str) -> RetuneState | None:
    return parse_state(kube.get_lease("default", state_lease_name(dgd)).annotations.get(STATE_ANNOTATION))


def decided(kube: KubeCluster, dgd: str, k: int) -> RetuneState | None:
    s = state_of(kube, dgd)
    return s if s is not None and s.last_window is not None and s.last_window >= k else None


def test_apply_advisory_promote_manual_revert_rollback(fleet: dict[str, Any]) -> None:
    world, app, kube, r = fleet["world"], fleet["app"], fleet["kube"], fleet["r"]
    llama, adv = world.frontends["llama"], world.frontends["adv"]
    first = tick(app, start_of(K) + 1)  # retune enabled during window K: K is skipped
    assert first["launched"] == []
    assert {d["deployment"]: d["status"] for d in first["deployments"]} == {"llama": "leader", "adv": "leader"}

    lines = traffic_lines(60, start_of(K + 1))
    segs = write_segments(world.trace_dir, "llama", sorted(llama), lines)
    # One corrupt gzip member in the middle of a segment: skipped and counted, the rest kept.
    blob = bytearray(gzip.compress(b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n'))
    blob[-5] ^= 0xFF
    segs[0].write_bytes(segs[0].read_bytes() + bytes(blob) + gzip.compress(b"\n"))
    write_segments(world.trace_dir, "adv", sorted(adv), traffic_lines(60, start_of(K + 1)))

    second = tick(app, start_of(K + 2) + 1)
    assert sorted((x["dgd"], x["window"]) for x in second["launched"]) == [("adv", K + 1), ("llama", K + 1)]
    st = wait_for(lambda: decided(kube, "llama", K + 1), "llama window decided", 120)
    rec = st.history[-1]
    assert (rec.outcome, rec.window, rec.replicas, rec.replicas_verified) == ("apply", K + 1, 4, True)
    assert rec.params is not None and rec.params["temperature"] == 0.0 and rec.improvement_pct > 0
    wait_for(lambda: all(fe.policy.temperature == 0.0 for fe in llama.values()), "llama routers converged")
    settings = resolve(fleet["config"].retune, "llama")
    sweep = FanIn(r).sweep(sweep_id("llama", K + 1, settings.generation, 1))
    assert sweep is not None and sweep.status == "decided"
    assert (sweep.extra["requests"], sweep.extra["corrupt_members"]) == (60, 1)
    assert not os.path.exists(sweep.window_file)  # removed once no shard reads it

    # Advisory: the recommendation is recorded, nothing is written; promote writes it.
    adv_state = wait_for(lambda: decided(kube, "adv", K + 1), "adv window decided", 120)
    assert adv_state.advisory is not None and adv_state.advisory.outcome == "advisory"
    assert all(fe.policy.temperature == 1.0 and not any(w.policy_sent for w in fe.writes) for fe in adv.values())
    assert all(len(fe.writes) == 1 for fe in adv.values())  # only the leader's barrier
    promoted = app.send_task("powerfleet.retune.promote", kwargs={"dgd": "adv"}).get(timeout=60)
    assert promoted["status"] == "promoted" and all(x["converged"] for x in promoted["routers"])
    assert all(fe.policy.temperature == 0.0 for fe in adv.values())

    # A manual change is reverted at the next round; the same closed window is never relaunched.
    fe0 = llama[sorted(llama)[0]]
    fe0.patch(b'{"revision": %d, "policy": {"temperature": 0.7}}' % fe0.revision, "operator")
    again = tick(app, start_of(K + 2) + 11)
    assert again["launched"] == []
    assert fe0.policy.temperature == 0.0 and fe0.writes[-1].leader == "ctl@retune"
    r.hdel("powerfleet:retune:last_launched", "llama")  # lost bookkeeping: the SET NX key still holds
    assert tick(app, start_of(K + 2) + 21)["launched"] == []
    assert r.exists(dedupe_key("llama", K + 1))

    # An empty window is a decision of its own.
    tick(app, start_of(K + 3) + 1)
    no_traffic = wait_for(lambda: decided(kube, "adv", K + 2), "adv empty window decided", 60)
    assert no_traffic.history[-1].outcome == "no-traffic"

    # Rollback: intent saved, then every router back to its initial settings.
    rolled = app.send_task("powerfleet.retune.rollback", kwargs={"dgd": "llama"}).get(timeout=60)
    assert rolled["status"] == "rolling-back" and rolled["verify_at"] is not None  # converged once
    assert all(fe.policy.temperature == 1.0 for fe in llama.values())
    # Verified again once the PATCH timeout has passed (the worker's clock is the real one).
    wait_for(lambda: app.send_task("powerfleet.retune.rollback", kwargs={"dgd": "llama"}).get(timeout=60)["status"]
             == "rolled-back", "the rollback verified", 60, every_s=1.0)
    assert state_of(kube, "llama").rollback == "done"


def test_a_sweep_worker_killed_mid_shard_still_decides(fleet: dict[str, Any]) -> None:
    world, app, kube, r = fleet["world"], fleet["app"], fleet["kube"], fleet["r"]
    llama = world.frontends["llama"]
    k = K + 5
    tick(app, start_of(k - 1) + 1)  # enables retune here when this test runs alone
    tick(app, start_of(k) + 1)
    write_segments(world.trace_dir, "llama", sorted(llama), traffic_lines(12000, start_of(k)), members=4,
                   tag="heavy")
    launched = tick(app, start_of(k + 1) + 1)
    assert {"dgd": "llama", "window": k} in launched["launched"]
    settings = resolve(fleet["config"].retune, "llama")
    term = next(d["term"] for d in launched["deployments"] if d["deployment"] == "llama")
    sid = sweep_id("llama", k, settings.generation, term)
    fan = FanIn(r)
    rec = wait_for(lambda: fan.sweep(sid), "the sweep record", 60)
    probe_key = rec.shards[0].key()

    def heavy_reader() -> tuple[str, str] | None:  # the probe is done, a grid shard is reading
        if fan.result(probe_key) is None:
            return None
        return next(((k2, w) for k2, w in fan.readers(sid).items() if k2 != probe_key), None)

    key, who = wait_for(heavy_reader, "a grid shard reading the window", 60, every_s=0.005)
    pid = int(who.rsplit(":", 1)[1])
    assert pid != fleet["sweep"].proc.pid  # the prefork child running the shard
    # The window step is redelivered too (as after a control worker crash); its shards queue
    # up behind the running one and adopt the results that exist.
    app.send_task("powerfleet.retune.window", kwargs={"dgd": "llama", "window": k, "leader": "ctl@retune",
                                                       "term": term, "generation": settings.generation})
    wait_for(lambda: r.llen("sweep") >= len(rec.shards), "the re-sent shards queued", 60, every_s=0.005)
    os.kill(pid, signal.SIGKILL)
    st = wait_for(lambda: decided(kube, "llama", k), "the window to decide after the kill", 180)
    assert st.history[-1].window == k and st.history[-1].outcome in ("apply", "keep")
    res = fan.result(key)
    assert res is not None and res.error is None and not res.host.endswith(f":{pid}")  # recomputed elsewhere
    assert fan.adopted(sid) >= 1

    # The killed run itself comes back: task_retry_on_worker_lost (on fleet-wide) turns the lost
    # child into a bounded retry of the same task id, 1 s later, without reject_on_worker_lost
    # (docs/retune.md "Killed shard runs"). Its retry ran to completion: it recomputed, adopted
    # the re-sent copy's result, or found the sweep final. The result backend says so.
    spec = next(sh for sh in rec.shards if sh.key() == key).model_dump(mode="json")

    def retried() -> dict[str, Any] | None:
        for name in r.scan_iter("celery-task-meta-*"):
            meta = json.loads(r.get(name) or b"{}")
            kw = meta.get("kwargs") or {}
            if (meta.get("name") == "powerfleet.sweep.shard" and meta.get("status") == "SUCCESS"
                    and kw.get("sid") == sid and kw.get("spec") == spec and (meta.get("retries") or 0) >= 1):
                return meta
        return None

    meta = wait_for(retried, "the killed shard run's retry to finish", 60, every_s=0.2)
    assert meta["result"]["status"] in ("computed", "adopted", "dropped") and meta["result"].get("redelivered", True)


def test_a_corrupt_state_is_replaced_by_the_next_tick(fleet: dict[str, Any]) -> None:
    app, kube = fleet["app"], fleet["kube"]
    tick(app, start_of(K + 18) + 1)  # launches the (empty) window K+17: let it settle first
    wait_for(lambda: decided(kube, "llama", K + 17), "window K+17 decided", 60)
    lease = kube.get_lease("default", state_lease_name("llama"))
    kube.update_lease(lease.model_copy(update={"annotations": {STATE_ANNOTATION: '{"schema": "x", "term": NaN'}}))
    out = tick(app, start_of(K + 18) + 11)
    row = next(d for d in out["deployments"] if d["deployment"] == "llama")
    assert row["status"] == "leader" and "NaN" in row["corrupt_state_replaced"]
    assert state_of(kube, "llama").term == row["term"]

def test_graceful_shutdown_releases_the_leases(fleet: dict[str, Any]) -> None:
    app, kube = fleet["app"], fleet["kube"]
    tick(app, start_of(K + 20) + 1)  # the control worker holds both Leases now
    assert {kube.get_lease("default", leader_lease_name(d)).holder_identity for d in ("llama", "adv")} == {"ctl@retune"}
    assert fleet["launcher"].stop_child(fleet["ctl"]) == 0  # SIGTERM: warm shutdown
    for d in ("llama", "adv"):
        assert kube.get_lease("default", leader_lease_name(d)).holder_identity is None
