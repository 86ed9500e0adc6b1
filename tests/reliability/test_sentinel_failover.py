"""The fleet on a replicated Redis behind three Sentinels, through the loss of its master.

Real processes on loopback: redis-server as master and two replicas (min-replicas-to-write 1),
three Sentinels (`redis-server --sentinel`, down-after 800 ms), shared by the module's tests
(the ``sentinels`` fixture hands each one the cluster whole again), and the fleet pointed at
them with a ``sentinel://`` URL list: beat, a control worker and one agent per node (simulated
GPUs, pods on the loopback API server), and one power-aware deployment whose budget is
evaluated every second. A graceful ``SENTINEL FAILOVER``, a SIGKILL of the master while a
reconcile fan-out is in flight, and one while a budget evaluation runs on a replica that missed
the master's last writes: after each promotion, with nobody restarting anything, beat leads
again and every tick family ticks, every node gets a reconcile pass, no evaluation acts on the
state from before the failover, and no process has died. The CLI's one-line errors for a
master no Sentinel knows, and a publish refused with NOREPLICAS (retried, then one line), run
first, on the cluster alone.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.beat.ticklog import TickLog
from powerfleet.broker.clients import redis_client
from powerfleet.broker.embedded import free_loopback_port
from powerfleet.broker.publish import BrokerRefusedWrite
from powerfleet.budget.state import OTHER_WRITER, REPLICAS
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config import load_config
from powerfleet.tasks.fleet import fan_out
from powerfleet.workers.app import TICK_FAMILIES, FleetCelery, create_app
from powerfleet.workers.launcher import Launcher
from tests.agent.conftest import device
from tests.budget.stand_in_operator import budget_status, dgd, replicas, settle
from tests.integration.conftest import run_cli, wait_worker
from tests.reliability.faults import HookedApiServer
from tests.reliability.sentinels import TEST_PASSWORD, SentinelCluster
from tests.reliability.test_redis_restart import node_pod, tick_passes
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
NODES = ("gpu-node-h", "gpu-node-i")
SECRET = TEST_PASSWORD  # the Redis nodes' and the Sentinels' password
ALPHA = "default/alpha"  # the power-aware deployment (its pods on BUDGET_NODES, no agent there)
BUDGET_NODES = ["gpu-node-b"]


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


@pytest.fixture(scope="module")
def fleet(sentinel_cluster: SentinelCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("sentinel-fleet")
    cluster = sentinel_cluster
    cluster.restore()
    with HookedApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        kube = KubeCluster.from_kubeconfig(str(kubeconfig))
        api.apply(dgd("alpha", 1, 1))
        settle(api, kube, "alpha", BUDGET_NODES)
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
        with Launcher(log_dir=tmp / "logs", env=dict(env)) as launcher:
            for i, node in enumerate(NODES):
                uid = f"{i:08d}-0000-4000-8000-00000000000{i}"
                api.apply(node_pod(node, uid))
                write_proc_entry(tmp / "proc" / node, 4242, uid)
                SimulatedGpus.shared(tmp / "sim" / f"{node}.json", [device(0, pids=[4242])])
                launcher.spawn(node, "agent", "--node", node, env={
                    "POWERFLEET_AGENT__PROC_ROOT": str(tmp / "proc" / node),
                    "POWERFLEET_AGENT__PROBE_PORT": str(ports[node])})
            launcher.spawn("ctl", "worker", "--queues", "control,sweep", "--name", "ctl@sentinel")
            app = create_app(load_config(environ=env))
            for name in ("ctl@sentinel", *(f"agent@{n}" for n in NODES)):
                wait_worker(app, name, timeout_s=90)
            launcher.spawn("beat", "beat")
            ticks = TickLog(redis_client(cluster.url, app.fleet_config.broker, socket_timeout=2))
            try:
                yield Fleet(cluster, api, kube, launcher, app, ticks, ports, env)
            finally:
                kube.close()


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
    assert broker["last_failover"]["age_s"] <= time.monotonic() - killed_at + 1  # this failover, not the first
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

    killed = api.once("GET", "/dynamographdeployments/alpha", lambda: sentinels.kill(old))
    wait_for(killed.is_set, "a budget evaluation reading alpha (the master SIGKILLed there)", 30)
    assert sentinels.wait_new_master(old) == stale
    carries_on(fleet, time.time())
    propose(decode=3)
    wait_for(lambda: replicas(api, "alpha")["decode"] == 3, "the first proposal after the failover carried out", 60)
    assert budget_status(api, "alpha")["reason"] != "OtherWriter"
    promoted = redis.Redis(port=stale, password=SECRET, socket_timeout=5)
    assert promoted.hget(OTHER_WRITER, ALPHA) is None  # no "another writer" finding, then or since
    promoted.close()
