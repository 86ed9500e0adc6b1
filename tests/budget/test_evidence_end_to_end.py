"""Enforcement evidence end to end (issue 18 item 8), all real parts: redis-server, a control
worker, two `powerfleet agent` worker processes over simulated GPUs, the loopback API server.

Deployment alpha (1 prefill, 2 decode; 1 GPU x 500 W per replica) runs on gpu-a1 and gpu-a2.
The agents cap each pod's GPU and publish their reports; with them fresh every GPU is charged at
its enforced 500 W and a scale-up goes. Then gpu-a2's agent is killed: once its reports are older
than three reconcile intervals (and its hash has expired), that node's GPUs are charged at their
maximum settable 700 W and the next scale-up is held (``enforcement_evidence_stale``), while
gpu-a1's live agent keeps its GPUs at their enforced limit.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from powerfleet.agent.evidence import evidence_key
from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.twin.apiserver import ApiServer
from tests.agent.conftest import device
from tests.budget.conftest import RACK_A_NODES
from powerfleet.testing.budget.stand_in_operator import budget_status, dgd, replicas, settle
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
A1, A2 = RACK_A_NODES
INTERVAL_S = 3  # beat.reconcile_interval_s: reports are fresh for 9 s, the agents' hashes live 9 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod_uids(api: ApiServer) -> dict[str, tuple[str, str]]:
    """The GPU pods (those with a power annotation; the Frontend holds none): name -> (uid, node)."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in api.list("v1", "Pod", "default")
            if POWER_ANNOTATION in (p["metadata"].get("annotations") or {})}


def test_fresh_reports_charge_enforced_limits_and_a_dead_agent_holds_scale_ups(rack_a, launcher, app, broker_url,
                                                                               tmp_path: Path):
    import redis

    api, kube, kubeconfig = rack_a
    r = redis.Redis.from_url(broker_url)
    api.apply(dgd("alpha", 1, 2))
    settle(api, kube, "alpha", RACK_A_NODES)  # prefill-0 and decode-0 on gpu-a1, decode-1 on gpu-a2
    gpus = {n: SimulatedGpus.shared(tmp_path / "sim" / f"{n}.json", [device(i) for i in range(3)]) for n in RACK_A_NODES}
    next_gpu = {n: 0 for n in RACK_A_NODES}
    started: set[str] = set()

    def start_processes() -> None:
        """Each new pod's serving process appears on the next free GPU of its node."""
        for name, (uid, node) in sorted(pod_uids(api).items()):
            if name in started:
                continue
            pid, i = 1000 + len(started), next_gpu[node]
            write_proc_entry(tmp_path / "proc" / node, pid, uid)

            def put(devs, i=i, pid=pid) -> None:
                devs[i].pids = [pid]
            gpus[node].update(put)
            next_gpu[node] += 1
            started.add(name)
    start_processes()

    launcher.env.update({
        "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": str(INTERVAL_S),
        "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp_path / "sim"),
        "POWERFLEET_AGENT__KUBECONFIG": str(kubeconfig), "POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state"),
        "POWERFLEET_AGENT__NAMESPACES": "[default]",
        "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
        "POWERFLEET_BUDGET__GROUPS": json.dumps({"rack-a": 10_000}),
        "POWERFLEET_BUDGET__MAX_SETTABLE_GPU_W": "700",  # the simulated GPUs' maximum settable limit
        "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({"default/alpha": {"power_limit_w": 4000}}),
    })  # budget.enforcement_evidence: the default (auto)
    agents = {n: launcher.spawn(f"agent-{n}", "agent", "--node", n, env={
        "POWERFLEET_AGENT__PROC_ROOT": str(tmp_path / "proc" / n), "POWERFLEET_AGENT__PROBE_PORT": str(free_port())})
        for n in RACK_A_NODES}
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@evidence", "--concurrency", "1")
    for name in ("ctl@evidence", *(f"agent@{n}" for n in RACK_A_NODES)):
        wait_worker(app, name)

    def reconcile(*nodes: str) -> None:
        for n in nodes:
            app.send_task("powerfleet.agent.reconcile", kwargs={"node": n}).get(timeout=30)

    def reported(node: str) -> dict[str, dict]:
        return {k.decode(): json.loads(v) for k, v in r.hgetall(evidence_key(node)).items()}

    def evidence_for_every_pod() -> bool:
        reconcile(*RACK_A_NODES)
        enforced = {(g["pod_uid"], g["enforced_w"]) for n in RACK_A_NODES for g in reported(n).values()}
        return all((uid, 500) in enforced for uid, _ in pod_uids(api).values())

    def tick(what: str, probe, live: tuple[str, ...] = RACK_A_NODES):
        reconcile(*live)  # the live agents' reports are fresh when the evaluation reads them
        assert app.send_task("powerfleet.budget.tick").get(timeout=60)["evaluations"] == ["default/alpha"]
        return wait_for(lambda: probe(s := budget_status(api, "alpha")) and s, what, timeout_s=60)

    wait_for(evidence_for_every_pod, "both agents to cap and report every pod's GPU", timeout_s=60)
    app.send_task("powerfleet.budget.propose", kwargs={"deployment": "default/alpha",
                                                       "replicas": {"prefill": 2}}).get(timeout=30)
    st = tick("alpha admitted, charged at the enforced limits, prefill scaled",
              lambda s: s.get("targets") == {"prefill": 2})
    assert st["chargeBasis"] == {"prefill": "enforced", "decode": "enforced"}
    assert "unenforcedWatts" not in st and "enforcement_evidence_stale" not in st["reasons"]
    assert replicas(api, "alpha") == {"prefill": 2, "decode": 2} and st["settledWatts"] == 4 * 500

    settle(api, kube, "alpha", RACK_A_NODES)  # prefill-1 starts on gpu-a2; its agent caps and reports it
    start_processes()
    wait_for(evidence_for_every_pod, "the new pod's GPU reported", timeout_s=60)

    agents[A2].proc.send_signal(signal.SIGKILL)  # a crash: no goodbye, its hash simply stops being renewed
    agents[A2].proc.wait(timeout=30)
    # its reports age out with their hash (TTL three intervals); the ledger remembers the node reported
    wait_for(lambda: not r.exists(evidence_key(A2)), "the dead agent's reports to expire", timeout_s=60)
    app.send_task("powerfleet.budget.propose", kwargs={"deployment": "default/alpha",
                                                       "replicas": {"prefill": 3}}).get(timeout=30)
    st = tick("gpu-a2's evidence stale: scale-ups held", lambda s: "enforcement_evidence_stale" in s.get("reasons", []),
              live=(A1,))
    # gpu-a2 holds decode-1 and prefill-1: 2 GPUs at 700 instead of 500 W
    assert st["chargeBasis"] == {"prefill": "max_settable", "decode": "max_settable"}
    assert st["unenforcedWatts"] == 2 * 200 and st["settledWatts"] == 4 * 500 + 400
    assert st["held"] == ["prefill"] and replicas(api, "alpha") == {"prefill": 2, "decode": 2}
    assert f"on {A2}: 0 of 1 GPUs with a fresh enforcement report" in st["message"]
    # (only gpu-a2's 2 GPUs are unenforced: gpu-a1's live agent keeps its pods' GPUs proven)
