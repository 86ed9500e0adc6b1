"""A rack is charged for every GPU pod on its nodes, listed or not (issue 18 item 2), with the
basis of each charge (item 8), and its watts are shared max-min fairly (item 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.evidence import ENFORCEMENT_KEY, Charge, GpuReport, RedisReports, parse_report, pod_charge
from powerfleet.budget.groups import Member, allocate
from powerfleet.budget.state import BudgetState
from powerfleet.budget.tick import tick_limits
from powerfleet.cluster.gpu_pods import KubeGpuPods, pod_gpus
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config.fleet import DeploymentBudgetConfig
from powerfleet.twin.apiserver import ApiServer
from powerfleet.testing.budget.stand_in_operator import dgd, settle

RACK = "powerfleet.io/rack"


def gpu(n: int) -> dict:
    return {"limits": {"nvidia.com/gpu": str(n)}}


def test_pod_gpus_count_native_sidecars_and_the_larger_init_phase():
    assert pod_gpus({"containers": [{"name": "main", "resources": gpu(2)}, {"name": "log"}]}) == 2
    # a native sidecar (restartPolicy: Always) holds its GPU beside the main containers
    assert pod_gpus({"initContainers": [{"name": "engine", "restartPolicy": "Always", "resources": gpu(4)}],
                     "containers": [{"name": "main"}]}) == 4
    # a plain init container runs before them: the pod holds the larger set
    assert pod_gpus({"initContainers": [{"name": "warm", "resources": gpu(8)}],
                     "containers": [{"name": "main", "resources": gpu(2)}]}) == 8
    assert pod_gpus({"containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": 1}}}]}) == 1


def test_a_pod_is_charged_the_larger_of_its_cap_and_fresh_enforced_limits_else_the_max_settable_limit():
    fresh = [GpuReport("GPU-a", "pod-1", 400, 310.0, at=100.0), GpuReport("GPU-b", "pod-1", 450, 300.0, at=100.0)]
    # each GPU at the larger of its annotation and its fresh enforced limit (issue 30 route 6)
    assert pod_charge("pod-1", 2, 300, {"n": fresh}, "n", 120.0, 90.0, 1000) == Charge(850, "enforced")
    assert pod_charge("pod-1", 2, 420, {"n": fresh}, "n", 120.0, 90.0, 1000) == Charge(870, "enforced")
    assert pod_charge("pod-1", 2, 500, {"n": fresh}, "n", 120.0, 90.0, 1000) == Charge(1000, "requested_cap")
    assert pod_charge("pod-1", 2, 300, {"n": fresh}, "n", 200.0, 90.0, 1000) == Charge(600, "requested_cap")
    got = pod_charge("pod-1", 2, None, {"n": fresh}, "n", 120.0, 90.0, 1000)
    assert (got.watts, got.basis) == (850, "enforced")
    stale = pod_charge("pod-1", 2, None, {"n": fresh}, "n", 200.0, 90.0, 1000)  # reports 100 s old, fresh for 90
    assert (stale.watts, stale.basis) == (2000, "max_settable")
    partial = pod_charge("pod-1", 3, None, {"n": fresh}, "n", 120.0, 90.0, 1000)  # one GPU without a report
    assert partial.basis == "max_settable" and partial.watts == 3000
    other_pod = pod_charge("pod-2", 1, None, {"n": fresh}, "n", 120.0, 90.0, 1000)
    assert other_pod.basis == "max_settable"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=60), st.text(max_size=60), st.dictionaries(
    st.sampled_from(["pod_uid", "enforced_w", "draw_w", "at", "x"]),
    st.none() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5), max_size=5).map(json.dumps)))
def test_a_report_of_any_shape_is_evidence_or_none(raw):
    got = parse_report("GPU-x", raw)
    assert got is None or (isinstance(got.enforced_w, int) and isinstance(got.at, float))


def test_reports_are_read_from_one_hash_per_node(broker_url):
    r = redis.Redis.from_url(broker_url)
    r.delete(ENFORCEMENT_KEY.format(node="gpu-1"))
    r.hset(ENFORCEMENT_KEY.format(node="gpu-1"), mapping={
        "GPU-a": json.dumps({"pod_uid": "u1", "enforced_w": 500, "draw_w": 412.5, "at": 10.0}), "GPU-b": "garbage"})
    got = RedisReports(r).reports(["gpu-1", "gpu-2"])
    assert got == {"gpu-1": [GpuReport("GPU-a", "u1", 500, 412.5, 10.0)]}


@pytest.fixture
def rack(tmp_path: Path, broker_url: str):
    with ApiServer() as api:
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        for n in ("gpu-0", "gpu-1"):
            api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {RACK: "r1"}}})
        yield api, kube, BudgetState(redis.Redis.from_url(broker_url))
        kube.close()


def tenant(api, name: str, gpus: int, cap: str | None = None, node: str = "gpu-1") -> None:
    api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": "other", "annotations": {} if cap is None else {"dynamo.nvidia.com/gpu-power-limit": cap}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": gpu(gpus)}]},
        "status": {"phase": "Running"}})


def test_an_unmanaged_tenant_lowers_what_listed_deployments_may_grow_into(rack):
    api, kube, state = rack
    for name in ("a", "b", "c"):
        api.apply(dgd(name, 1, 1))  # 1 GPU x 500 W per replica: 1,000 W each
        settle(api, kube, name, ["gpu-0"])
        state.propose(f"default/{name}", {"decode": 9}, at=0, source="test")
    tenant(api, "unannotated", 2)  # no cap, no report: 2 x 1,000 W (maximum settable)
    tenant(api, "capped", 1, cap="700")  # its annotation's cap: 700 W
    tenant(api, "cpu-only", 0)  # holds no GPU: charged nothing
    cfg = {f"default/{k}": DeploymentBudgetConfig(power_limit_w=10_000) for k in ("a", "b", "c")}
    plan = tick_limits(kube, state, cfg, {"r1": 9000}, RACK, KubeGpuPods(kube), now=100.0, max_settable_w=1000)
    assert plan.group_unmanaged == {"r1": 2700}
    assert plan.group_basis == {"r1": {"max_settable": 2000, "requested_cap": 700}}
    assert plan.group_current == {"r1": 3 * 1000 + 2700}
    # 9,000 - 2,700 - 3 x 1,000 = 3,300 W free, split max-min fair: 1,100 W of growth each
    assert [plan.limits[f"default/{k}"].limit_w for k in "abc"] == [2100, 2100, 2100]
    assert plan.group_peak_bound == {"r1": 2700 + 3 * 2100} and plan.group_peak_bound["r1"] <= 9000
    # without the tenants the same deployments would have been allowed 3,000 W each
    alone = tick_limits(kube, state, cfg, {"r1": 9000}, RACK, None, now=100.0)
    assert [alone.limits[f"default/{k}"].limit_w for k in "abc"] == [3000, 3000, 3000]


def test_group_sharing_is_max_min_fair_with_an_unmanaged_tenant():
    # docs/budget.md: minimums first, then the rest water-filled over what each wants (capped by its
    # own limit); the tenant's draw is fixed. 10,000 W rack, tenant 2,000 W: 8,000 W to share.
    from powerfleet.budget.fleet import UNMANAGED, unmanaged_member

    members = {"small": Member(1000, 1500, 1000, 10_000), "big": Member(1000, 9000, 1000, 10_000),
               "capped": Member(1000, 9000, 1000, 2500), UNMANAGED: unmanaged_member(2000)}
    res = allocate(10_000, members)
    shares = {k: a.share_w for k, a in res.allowances.items()}
    # small wants 1,500 and gets it; capped is held at its own 2,500; big takes the rest
    assert shares == {"small": 1500, "big": 4000, "capped": 2500, UNMANAGED: 2000}
    # max-min: nobody could get more without taking from someone who has less than it
    assert shares["big"] > shares["capped"] > shares["small"] and sum(shares.values()) == 10_000


def test_a_node_whose_agent_reported_once_stays_a_reporting_node_after_its_hash_expires(broker_url):
    from powerfleet.budget.evidence import REPORTING_NODES_KEY

    r = redis.Redis.from_url(broker_url)
    report = json.dumps({"pod_uid": "u1", "enforced_w": 500, "draw_w": 1.0, "at": 10.0})
    r.hset(ENFORCEMENT_KEY.format(node="gpu-1"), mapping={"GPU-a": report})
    r.hset(ENFORCEMENT_KEY.format(node="gpu-3"), mapping={"GPU-c": "not evidence"})  # an agent all the same
    assert RedisReports(r, 5.0).reports(["gpu-1", "gpu-2", "gpu-3"]) == {
        "gpu-1": [GpuReport("GPU-a", "u1", 500, 1.0, 10.0)], "gpu-3": []}
    assert set(r.hkeys(REPORTING_NODES_KEY)) == {b"gpu-1", b"gpu-3"}
    r.delete(ENFORCEMENT_KEY.format(node="gpu-1"))  # the agent stopped: its hash expired
    assert RedisReports(r, 6.0).reports(["gpu-1", "gpu-2"]) == {"gpu-1": []}  # gpu-2: never an agent


def test_a_racks_ledger_charges_a_listed_pod_without_fresh_evidence_at_the_maximum_settable_limit(rack, broker_url):
    api, kube, state = rack
    r = redis.Redis.from_url(broker_url)
    api.apply(dgd("a", 1, 1))  # 1 GPU x 500 W per replica
    settle(api, kube, "a", ["gpu-0"])
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in api.list("v1", "Pod", "default")}
    # gpu-0's agent reports prefill's pod, not decode's: decode's GPU is charged 1,000 W, not 500
    r.hset(ENFORCEMENT_KEY.format(node="gpu-0"), mapping={"GPU-p": json.dumps(
        {"pod_uid": uids["a-prefill-0"], "enforced_w": 500, "draw_w": 300.0, "at": 100.0})})
    cfg = {"default/a": DeploymentBudgetConfig(power_limit_w=10_000)}

    def current(mode: str) -> int:
        return tick_limits(kube, state, cfg, {"r1": 9000}, RACK, KubeGpuPods(kube), RedisReports(r), now=110.0,
                           max_settable_w=1000, evidence_mode=mode).group_current["r1"]  # type: ignore[arg-type]
    assert current("auto") == 500 + 1000
    assert current("off") == 500 + 500
    r.delete(ENFORCEMENT_KEY.format(node="gpu-0"))  # the agent stopped: both GPUs unproven now
    assert current("auto") == 1000 + 1000


def test_a_pod_off_the_budgeted_nodes_is_judged_too_as_its_evaluation_judges_it(rack, broker_url):
    api, kube, state = rack
    r = redis.Redis.from_url(broker_url)
    api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-9"}})  # in no group
    api.apply(dgd("a", 1, 2))
    settle(api, kube, "a", ["gpu-0", "gpu-9"])  # decode-1 lands on gpu-9
    # gpu-9's agent reported once (it is remembered) and now has nothing for decode-1
    r.hset(ENFORCEMENT_KEY.format(node="gpu-9"), mapping={"GPU-x": json.dumps(
        {"pod_uid": "someone-else", "enforced_w": 500, "draw_w": 0.0, "at": 100.0})})
    cfg = {"default/a": DeploymentBudgetConfig(power_limit_w=10_000)}
    plan = tick_limits(kube, state, cfg, {"r1": 9000}, RACK, KubeGpuPods(kube), RedisReports(r), now=110.0,
                       max_settable_w=1000)
    # the deployment's own charge judges decode-1 as its evaluation does: its GPU at 1,000 W
    assert plan.limits["default/a"].current_w == 3 * 500 + 500
    # the rack is charged what is physically on its nodes: decode-1 is not on r1
    assert plan.group_current["r1"] == 2 * 500
