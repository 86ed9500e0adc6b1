"""The Kubernetes API answering 500s, timeouts and 409s, on the wire (FaultyApiServer, official
client, real Redis): the agent changes nothing, the budget planner holds, retune defers; each
recovers on its next pass/evaluation/tick once the API heals.

The domain code runs in this process through the same ports its tasks build (the task layer
adds only argument decoding; tests/agent, tests/budget and tests/retune run it in workers).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from powerfleet.agent.build import node_pod_lister
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.reconcile import NodeAgent
from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.agent.state import StateStore
from powerfleet.budget.persist import ConfigMapStatus
from powerfleet.budget.program import DeploymentBudget
from powerfleet.budget.runner import evaluate_deployment as run_evaluation
from powerfleet.budget.state import BudgetState
from powerfleet.clock import FakeClock
from powerfleet.cluster import kube as kube_module
from powerfleet.cluster.budget_store import KubeBudgetStore
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.kube import KubeCluster
from powerfleet.retune import control
from powerfleet.retune.windows import dedupe_key
from powerfleet.testing.retune_world import BASE_K, World, start_of
from tests.agent.conftest import device
from powerfleet.testing.budget.stand_in_operator import budget_status, dgd, replicas, settle
from powerfleet.testing.api_faults import FaultyApiServer
from tests.retune.conftest import Outbox, make_ports, retune_config

pytestmark = pytest.mark.integration
FAULTS = ("500", "timeout", "409")


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultyApiServer, KubeCluster]]:
    # The client's timeout is 25 s in production; a stalled API server must cost the test far less.
    monkeypatch.setattr(kube_module, "REQUEST_TIMEOUT_SECONDS", 0.3)
    with FaultyApiServer() as server:
        kube = KubeCluster.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server, kube
        kube.close()


def test_an_agent_changes_nothing_while_the_api_fails_and_caps_once_it_heals(api, tmp_path: Path) -> None:
    server, kube = api
    uid = str(uuidlib.uuid4())
    server.apply({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "decode-0", "namespace": "llm", "uid": uid, "annotations": {POWER_ANNOTATION: "300"}},
                  "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "m"}]},
                  "status": {"phase": "Running"}})
    write_proc_entry(tmp_path / "proc", 4242, uid)
    gpus = SimulatedGpus([device(0, pids=[4242]), device(1)])
    agent = NodeAgent("node-a", open_gpus=lambda: gpus, list_pods=node_pod_lister(kube, "node-a", ["llm"]),
                      proc_root=tmp_path / "proc", state=StateStore(tmp_path / "state"),
                      clock=FakeClock(t=1_800_000_000.0, mono=10.0), safe_default_watts=500,
                      metrics=AgentMetrics(CollectorRegistry()))
    for kind in ("500", "timeout"):
        with server.failing(kind):
            report = agent.run_pass()
        assert report.skipped and "pod list failed" in report.skipped, kind  # a pass that cannot list changes nothing
        assert gpus.sets == [] and [d.current_w for d in gpus.devices()] == [700, 700], kind
    assert server.failures("500") and server.failures("timeout")
    healed = agent.run_pass()
    assert healed.skipped is None and [d.current_w for d in gpus.devices()] == [300, 700]
    # A 409 answers only writes, and the agent never writes to the API: its passes go on.
    server.apply({**server.get("v1", "Pod", "decode-0", "llm"), "metadata": {
        **server.get("v1", "Pod", "decode-0", "llm")["metadata"], "annotations": {POWER_ANNOTATION: "250"}}})
    with server.failing("409"):
        assert agent.run_pass().skipped is None
    assert [d.current_w for d in gpus.devices()] == [250, 700]


def evaluate_deployment(kube, state, key, budget, group, clock):
    """The runner with the configured default store (its status ConfigMap), as the task builds it."""
    return run_evaluation(kube, state, key, budget, group, clock, ConfigMapStatus(KubeBudgetStore(kube)))


def test_the_planner_holds_while_the_api_fails_and_scales_once_it_heals(api, broker_url: str) -> None:
    server, kube = api
    state = BudgetState(redis.Redis.from_url(broker_url))
    budget = DeploymentBudget(power_limit_w=5000)
    clock = FakeClock(t=1_800_000_000.0)
    server.apply(dgd("llama", 1, 1))
    settle(server, kube, "llama", ["gpu-0"])
    assert evaluate_deployment(kube, state, "default/llama", budget, None, clock).reason != "ReadFailed"  # admitted
    state.propose("default/llama", {"decode": 3}, at=clock.now(), source="test")
    before = server.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "llama")["metadata"]["resourceVersion"]
    for kind in FAULTS:
        clock.advance(30)
        with server.failing(kind):
            # A 409 on the replica or the status write is re-planned at the next evaluation.
            out = evaluate_deployment(kube, state, "default/llama", budget, None, clock)
        assert out.replicas_written == {} and "Scaled" not in out.events and not out.status_written, (kind, out)
        assert replicas(server, "llama") == {"prefill": 1, "decode": 1}, kind
    assert server.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "llama")["metadata"]["resourceVersion"] == before
    assert server.failures("409") >= 1  # the 409 round got as far as its write and was refused
    clock.advance(30)
    healed = evaluate_deployment(kube, state, "default/llama", budget, None, clock)
    assert healed.replicas_written == {"decode": 3} and replicas(server, "llama") == {"prefill": 1, "decode": 3}
    assert budget_status(server, "llama")["targets"] == {"decode": 3}


def test_retune_defers_while_the_api_fails_and_launches_the_window_once_it_heals(api, broker_url: str,
                                                                                 tmp_path: Path) -> None:
    server, kube = api
    (tmp_path / "traces").mkdir()
    world = World(server, tmp_path / "traces", tmp_path / "kubeconfig")
    try:
        world.add_deployment("llama")
        cfg = retune_config(world, ["llama"])
        clock = FakeClock(t=start_of(BASE_K) + 1, mono=1000.0)
        outbox = Outbox()
        ports = make_ports(broker_url, kube, "ctl@faults", clock, outbox)
        first = control.tick(cfg, ports, clock.now())  # enabled during window K: K is skipped
        assert first[0]["status"] == "leader" and first[0]["launched"] == []
        clock.advance(start_of(BASE_K + 2) + 1 - clock.now())  # window K+1 has closed
        for kind in FAULTS:
            clock.advance(10)  # past lease_renew_s: the tick must write the Lease to keep leading
            with server.failing(kind):
                row = control.tick(cfg, ports, clock.now())[0]
            assert row["status"] in ("cluster-error", "standby"), (kind, row)
            assert outbox.of(control.WINDOW_TASK) == [], kind
            assert not ports.r.exists(dedupe_key("llama", BASE_K + 1)), kind
        clock.advance(10)
        healed = control.tick(cfg, ports, clock.now())[0]
        assert healed["status"] == "leader" and healed["launched"] == [BASE_K + 1]
        clock.advance(10)
        assert control.tick(cfg, ports, clock.now())[0]["launched"] == []  # launched once
        assert [kw["window"] for kw in outbox.of(control.WINDOW_TASK)] == [BASE_K + 1]
    finally:
        world.stop()
