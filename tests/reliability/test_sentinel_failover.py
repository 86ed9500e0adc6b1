"""The fleet on a replicated Redis behind three Sentinels, through the loss of its master.

Real processes on loopback: the session's redis-server master and two replicas
(min-replicas-to-write 1) and three Sentinels (`redis-server --sentinel`, down-after 800 ms;
tests/reliability/conftest.py, handed to each test whole again by ``sentinels``), and the fleet
pointed at them with ``sentinel://`` URL lists (tests/reliability/sentinel_fleet.py; the cluster is
powerfleet/testing/sentinels.py): beat, a
control worker, one agent per node and the budget of one deployment, and a retune worker on a
clock file. A graceful ``SENTINEL FAILOVER``, then a SIGKILL of the master while a reconcile
fan-out is in flight, while a budget evaluation runs on a replica that missed the master's last
writes, and while a retune shard reads its window: after each promotion, with nobody restarting
anything, beat leads again, every tick family ticks, every node gets a reconcile pass, no
evaluation acts on budget state older than the failover, the retune window ends in exactly one
recorded outcome, and no process has died. The CLI's one-line errors for a master no Sentinel
knows, and a publish refused with NOREPLICAS (retried, then one line), run first, on the
cluster alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from powerfleet.broker.clients import redis_client
from powerfleet.broker.publish import BrokerRefusedWrite
from powerfleet.budget.state import OTHER_WRITER, REPLICAS
from powerfleet.config import load_config
from powerfleet.tasks.fleet import fan_out
from powerfleet.testing.failover import RETUNE_BUDGET_S, state_of
from powerfleet.testing.retune_world import BASE_K, start_of, traffic_lines, write_segments
from powerfleet.testing.sentinels import TEST_PASSWORD, SentinelCluster
from powerfleet.testing.waiting import wait_for, wait_worker
from powerfleet.workers.app import TICK_FAMILIES, create_app
from powerfleet.testing.budget.stand_in_operator import budget_status, replicas, settle
from tests.integration.conftest import run_cli
from tests.reliability.sentinel_fleet import (
    ALPHA,
    BUDGET_NODES,
    NODES,
    Fleet,
    carries_on,
    log_since,
    log_size,
    reconnects,
    running_fleet,
)

pytestmark = pytest.mark.integration
SECRET = TEST_PASSWORD  # the Redis nodes' and the Sentinels' password
# What a retune window may end in after losing the master mid-sweep: (outcome, failure_reason).
ONE_OUTCOME = {("apply", None), ("keep", None), ("abandoned", "time-budget"), ("dropped", "lost-broker-state")}


@pytest.fixture(scope="module")
def fleet(sentinel_cluster: SentinelCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(sentinel_cluster, tmp_path_factory.mktemp("sentinel-fleet")) as f:
        yield f


# -- on the cluster alone, before the module's fleet starts (they change the master's settings) --
def test_a_master_name_no_sentinel_knows_fails_in_one_line(sentinels: SentinelCluster) -> None:
    env = sentinels.env()
    bad = {**env, "POWERFLEET_BROKER__SENTINEL__MASTER_NAME": "nosuch"}
    out = run_cli("status", env=bad, timeout=60)
    assert out.returncode == 2, out
    assert out.stderr.strip().count("\n") == 0 and "no Sentinel knows a master named 'nosuch'" in out.stderr
    assert SECRET not in out.stderr and ":***@127.0.0.1" in out.stderr  # the URL is shown redacted
    missing = {k: v for k, v in env.items() if k != "POWERFLEET_BROKER__SENTINEL__MASTER_NAME"}
    out = run_cli("status", env=missing, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "broker.sentinel.master_name" in out.stderr


def test_a_publish_refused_with_noreplicas_is_retried_then_reported_in_one_line(sentinels: SentinelCluster) -> None:
    db = 2  # its own database: the queue it counts holds only its own publishes
    app = create_app(load_config(environ={**sentinels.env(db), "POWERFLEET_BROKER__NOREPLICAS_RETRY_S": "1"}))
    app.send_task("powerfleet.fleet.echo", kwargs={"payload": 1}, ignore_result=True)  # replicas in sync: sent
    master = redis.Redis(port=sentinels.master_port(), db=db, password=SECRET, socket_timeout=5)
    # As when its replicas fall behind: the master requires more in-sync replicas than it has.
    master.config_set("min-replicas-to-write", 3)
    try:
        with pytest.raises(BrokerRefusedWrite) as err:
            app.send_task("powerfleet.fleet.echo", kwargs={"payload": 2}, ignore_result=True)
    finally:
        master.config_set("min-replicas-to-write", 1)
    assert "NOREPLICAS" in str(err.value) and "\n" not in str(err.value)
    app.send_task("powerfleet.fleet.echo", kwargs={"payload": 3}, ignore_result=True)
    assert master.llen("control") == 2  # the refused publish left nothing behind
    master.delete("control")
    master.close()


# -- the fleet on the cluster ---------------------------------------------------------------------
def test_a_graceful_sentinel_failover_is_carried_through(fleet: Fleet, sentinels: SentinelCluster) -> None:
    wait_for(lambda: all(fleet.ticks.counts().get(f, 0) >= 1 for f in TICK_FAMILIES), "the first ticks", 60)
    old = fleet.cluster.master_port()
    fleet.cluster.graceful_failover()
    new = fleet.cluster.wait_new_master(old)
    fleet.cluster.wait_demoted(old)  # from here on nobody can still be writing to the old master
    carries_on(fleet, time.time())
    assert fleet.cluster.master_port() == new  # it was carried by the promoted master, not a new one
    for node in NODES:  # the agents followed the promoted master, and say so
        assert reconnects(fleet.probe_ports[node], "master_changed") >= 1, node
    # Every process heard Sentinel's +switch-master and left the old master for its writes.
    heard = {c.name for c in fleet.launcher.children if f"switched master fleet to 127.0.0.1:{new}" in c.log.read_text()}
    assert heard == {c.name for c in fleet.launcher.children}, heard


def test_a_master_killed_mid_fan_out_is_carried_through(fleet: Fleet, sentinels: SentinelCluster) -> None:
    old = fleet.cluster.master_port()
    fan_out(fleet.app, list(NODES), expires=5)
    killed_at = time.monotonic()
    fleet.cluster.kill(old)  # SIGKILL: the fan-out's messages may or may not have reached a replica
    fleet.cluster.wait_new_master(old)
    carries_on(fleet, time.time())
    status = run_cli("status", "--json", env=fleet.env, timeout=60)
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    # Every worker announced itself, so status waited for exactly them (and none is missing).
    assert set(data["workers"]) == {"ctl@sentinel", *(f"agent@{n}" for n in NODES)}
    assert data["workers_not_answering"] == []
    broker = data["broker"]
    assert broker["master"] == f"127.0.0.1:{fleet.cluster.master_port()}"
    assert len(broker["replicas"]) == 2  # the survivor and the killed one (Sentinel remembers it, down)
    assert broker["last_failover"]["epoch"] >= 2  # the config epoch rises with each failover
    # This failover, not the first (which came before the fixture's start): the age is at most the
    # time since the kill, with slack for Sentinel's own clock and rounding on a loaded machine.
    assert broker["last_failover"]["age_s"] <= time.monotonic() - killed_at + 5, (broker, time.monotonic() - killed_at)
    # The password reached every process (it authenticated) and no log line or output.
    assert SECRET not in status.stdout + status.stderr
    for child in fleet.launcher.children:
        assert SECRET not in child.log.read_text(errors="replace"), child.name
    # A worker that announced itself and does not answer is named (status waits --timeout for it).
    redis_client(fleet.cluster.url, fleet.app.fleet_config.broker).set("powerfleet:worker:ghost@nowhere", "1", ex=30)
    again = run_cli("status", "--json", "--timeout", "0.5", env=fleet.env, timeout=60)
    assert json.loads(again.stdout)["workers_not_answering"] == ["ghost@nowhere"]


def recorded_counts(port: int) -> dict[str, int]:
    """The replica counts the budget's last evaluation of alpha left, as Redis node ``port`` holds them."""
    client = redis.Redis(port=port, password=SECRET, socket_timeout=5)
    try:
        raw = client.hget(REPLICAS, ALPHA)
    finally:
        client.close()
    record = json.loads(raw) if raw else {}
    return dict(record.get("counts", record))


def test_no_budget_evaluation_acts_on_state_from_before_the_master_was_killed(fleet: Fleet,
                                                                             sentinels: SentinelCluster) -> None:
    """The master dies while a budget evaluation runs, and the replica promoted had missed its last
    writes (asynchronous replication: with min-replicas-to-write the other replica kept the master
    writable). Among them, the counts powerfleet's own scaling left: compared with the cluster, the
    promoted copy would show alpha's decode moved by "another writer", a finding that stops its
    scaling until someone re-admits it. It is not compared (older than the failover); the
    evaluation re-derives it, and the next proposal is carried out."""
    api, kube, app = fleet.api, fleet.kube, fleet.app

    def propose(**counts: int) -> None:
        app.send_task("powerfleet.budget.propose", kwargs={"deployment": ALPHA, "replicas": counts}).get(timeout=60)

    wait_for(lambda: budget_status(api, "alpha").get("reason") == "Planned", "alpha admitted and planned", 60)
    old, stale = sentinels.master_port(), sentinels.promotable_replica()
    wait_for(lambda: recorded_counts(stale).get("decode") == 1, "the counts replicated everywhere", 30)
    sentinels.cut_replication(stale)
    propose(decode=2)
    wait_for(lambda: replicas(api, "alpha")["decode"] == 2, "alpha's decode scaled to 2", 60)
    wait_for(lambda: recorded_counts(old).get("decode") == 2, "the evaluation's counts recorded on the master", 30)
    assert recorded_counts(stale).get("decode") == 1  # the replica a failover promotes lacks them
    settle(api, kube, "alpha", BUDGET_NODES)  # the operator rolled the second decode out

    # A tick's evaluations run as one batch on one snapshot (budget/batch.py): its all-namespace LIST
    # of the budget's status ConfigMaps is read by the batch alone, after the tick, mid-evaluation.
    killed = api.once("GET", "/api/v1/configmaps", lambda: sentinels.kill(old))
    wait_for(killed.is_set, "a budget evaluation batch reading the cluster (the master SIGKILLed there)", 30)
    assert sentinels.wait_new_master(old) == stale
    carries_on(fleet, time.time())
    # The first proposal after the failover is carried out. Judged on the cluster, not on this test
    # process's result subscription (which can sit on the dead master for a while: 2 of 3 full runs
    # timed out on .get() here); a proposal is idempotent (the last one written wins), so it is sent
    # again while its effect has not been seen.
    last_sent = [0.0]

    def carried_out() -> bool:
        if replicas(api, "alpha")["decode"] == 3:
            return True
        if time.monotonic() - last_sent[0] > 20:
            app.send_task("powerfleet.budget.propose", kwargs={"deployment": ALPHA, "replicas": {"decode": 3}})
            last_sent[0] = time.monotonic()
        return False

    wait_for(carried_out, "the first proposal after the failover carried out", 90)
    assert budget_status(api, "alpha")["reason"] != "OtherWriter"
    promoted = redis.Redis(port=stale, password=SECRET, socket_timeout=5)
    assert promoted.hget(OTHER_WRITER, ALPHA) is None  # no "another writer" finding, then or since
    promoted.close()


# Was quarantined (issue 31): in one clean-clone run under pytest-xdist the retune worker gave no answer
# to ping for 90 s after the promotion. Likely the worker crash on a collected connection fixed in
# broker/transport.py (a worker that died answers no ping); not reproduced in 18 runs since, 9 of them
# on 2026-12-02 at load average 8-11 beside a loaded full-suite run. A failure prints the worker's log
# since the kill.
def test_a_master_killed_mid_sweep_leaves_the_retune_window_exactly_one_outcome(fleet: Fleet,
                                                                                sentinels: SentinelCluster) -> None:
    """The master dies while a shard reads the window (the sweep record, fan-in counters and
    results live in Redis): the window still ends in exactly one recorded outcome in the state
    Lease, nothing stays pending, and later ticks launch nothing for it again."""
    rt = fleet.retune
    k = BASE_K + 1

    def tick() -> dict[str, Any]:  # no "now": the worker reads the clock file
        return rt.app.send_task("powerfleet.retune.tick", kwargs={}).get(timeout=90)

    assert rt.enabled.get(timeout=90)["launched"] == []  # enabled in window K (at the fleet's start)
    write_segments(rt.world.trace_dir, "llama", sorted(rt.world.frontends["llama"]), traffic_lines(4000, start_of(k)))
    rt.clock.set(start_of(k + 1) + 1)
    assert tick()["launched"] == [{"dgd": "llama", "window": k}]
    rec = wait_for(lambda: next(iter(rt.fan.active("llama")), None), "the sweep record", 60)
    wait_for(lambda: rt.fan.readers(rec.sid), "a shard reading the window", 60, every_s=0.005)

    old = sentinels.master_port()
    log_at = log_size(fleet, "retune")
    sentinels.kill(old)  # SIGKILL mid-sweep
    sentinels.wait_new_master(old)
    try:
        wait_worker(rt.app, rt.worker, timeout_s=90)  # it reconnected by itself
    except AssertionError as exc:  # issue 31: once under xdist it did not; keep what it said then
        raise AssertionError(f"{exc}\n{rt.worker}'s log since the kill:\n{log_since(fleet, 'retune', log_at)}") from None
    rt.clock.set(start_of(k + 1) + 1 + RETUNE_BUDGET_S + 1)  # past the sweep's deadline
    after = tick()
    assert after["launched"] == [] and after["deployments"][0]["status"] == "leader", after
    kube = fleet.kube
    st = wait_for(lambda: (s := state_of(kube)) is not None and s.last_window == k and s, "window k ended", 120)
    ended = [h for h in st.history if h.window == k]
    assert len(ended) == 1 and (ended[0].outcome, ended[0].failure_reason) in ONE_OUTCOME, st.history
    assert st.pending == [] and st.counts == {ended[0].outcome: 1}, st  # one outcome, counted once
    rt.clock.set(start_of(k + 1) + 59)
    assert tick()["launched"] == []  # later ticks neither relaunch it nor end it again
    again = state_of(kube)
    assert again is not None and [h.window for h in again.history].count(k) == 1 and again.counts == st.counts
    carries_on(fleet, time.time())  # the rest of the fleet went through the same failover
