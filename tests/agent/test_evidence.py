"""Enforcement evidence: one Redis hash per node, a JSON field per GPU UUID, replaced atomically."""

from __future__ import annotations

import json

import redis

from powerfleet.agent.evidence import EvidencePublisher, evidence_key
from powerfleet.agent.simulated import SimulatedGpus
from tests.agent.conftest import Bench, device
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures


def test_a_pass_publishes_each_gpus_evidence_and_none_without_a_readback(bench: Bench, broker_url: str) -> None:  # noqa: F811
    r = redis.Redis.from_url(broker_url)
    bench.gpus = SimulatedGpus([device(0, draw_w=612.5), device(1, fail=["readback"]), device(2)])
    uid = bench.pod("decode-0", "300", pids=(101,))
    bench.set_pids(0, [101])
    bench.set_pids(1, [101])
    agent = bench.agent()
    report = agent.run_pass()
    pub = EvidencePublisher(r, "node-a", 45)
    pub.publish(report, agent.last_pods)
    got = {k.decode(): json.loads(v) for k, v in r.hgetall(evidence_key("node-a")).items()}
    assert set(got) == {"GPU-0000", "GPU-0001", "GPU-0002"}
    g0, g1, g2 = got["GPU-0000"], got["GPU-0001"], got["GPU-0002"]
    assert g0["pods"] == [{"uid": uid, "namespace": "default", "name": "decode-0"}]
    assert (g0["requested_w"], g0["target_w"], g0["enforced_w"], g0["draw_w"], g0["write"], g0["readback"]) == (
        300, 300, 300, 612.5, "ok", "match")
    assert g0["revision"] > 0 and (g0["min_w"], g0["max_w"]) == (200, 700)
    assert (g1["write"], g1["readback"], g1["enforced_w"]) == ("ok", "mismatch", None)  # no value without evidence
    assert (g2["decision"], g2["target_w"], g2["enforced_w"]) == ("idle", None, 700)
    assert 0 < r.ttl(evidence_key("node-a")) <= 45

    # The next pass replaces the hash as a whole: a GPU gone from the node is gone from it.
    bench.gpus.update(lambda devs: devs.pop())
    pub.publish(agent.run_pass(), agent.last_pods)
    assert {k.decode() for k in r.hkeys(evidence_key("node-a"))} == {"GPU-0000", "GPU-0001"}


def test_the_revision_moves_only_when_the_target_changes(bench: Bench) -> None:
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    first = agent.run_pass().gpus[0].revision
    assert agent.run_pass().gpus[0].revision == first
    bench.pods[0].annotations["dynamo.nvidia.com/gpu-power-limit"] = "250"
    assert agent.run_pass().gpus[0].revision == first + 1  # type: ignore[operator]


def test_the_budget_ledger_and_the_power_guard_read_what_the_agent_publishes(bench: Bench, broker_url: str) -> None:  # noqa: F811
    """One format, three parties: the agent writes the hash, the ledger (budget/evidence.py) and
    the guard (power/telemetry.py) read the same key and find each GPU's figures."""
    from powerfleet.budget.evidence import RedisReports
    from powerfleet.power.telemetry import RedisTelemetry

    r = redis.Redis.from_url(broker_url)
    bench.gpus = SimulatedGpus([device(0, draw_w=612.5), device(1)])
    uid = bench.pod("decode-0", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    report = agent.run_pass()
    EvidencePublisher(r, "node-a", 45).publish(report, agent.last_pods)

    ledger = {g.gpu_uuid: g for g in RedisReports(r).reports(["node-a"])["node-a"]}
    assert (ledger["GPU-0000"].pod_uid, ledger["GPU-0000"].enforced_w, ledger["GPU-0000"].draw_w) == (uid, 300, 612.5)
    assert ledger["GPU-0000"].at == report.at
    guard = {t.gpu: t for t in RedisTelemetry(r).read(["node-a"])["node-a"]}
    assert (guard["GPU-0000"].pod_uid, guard["GPU-0000"].cap_w, guard["GPU-0000"].draw_w) == (uid, 300, 612.5)
    assert (guard["GPU-0000"].min_w, guard["GPU-0000"].max_w) == (200, 700)
