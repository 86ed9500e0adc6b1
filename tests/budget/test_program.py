"""The evaluation program: admission, drift, planning, the desired status and its events (pure)."""

from __future__ import annotations

from dataclasses import replace

from powerfleet.budget.program import DeploymentBudget, GroupLimit, Snapshot, evaluate
from powerfleet.cluster.dgd import parse_dgd
from powerfleet.cluster.immutability import admit_power_inputs
from powerfleet.cluster.objects import PodInfo
from tests.cluster.builders import disagg, pod_obj

# prefill: 2 GPUs x 350 W = 700 W/replica (2 replicas); decode: 4 GPUs x 300 W x 2 nodes = 2400 W/replica (1)


def settled(**comp_overrides):
    comps = {"prefill": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2},
             "decode": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}
    comps.update(comp_overrides)
    return {"observedGeneration": 1, "rollingUpdate": {"phase": "Completed"}, "components": comps}


def pods(decode_cap="300"):
    def info(obj):
        m = obj["metadata"]
        return PodInfo(name=m["name"], namespace="default", labels=m["labels"], annotations=m["annotations"],
                       phase="Running", node_name="gpu-0")
    return [info(pod_obj("p0", comp="prefill", cap="350")), info(pod_obj("p1", comp="prefill", cap="350")),
            info(pod_obj("d0", comp="decode", cap=decode_cap)), info(pod_obj("d0w", comp="decode", cap=decode_cap))]


def snap(dgd_obj, *, admitted=None, proposal=None, pod_list="default", limit=8000, group=None, was_rolling=False):
    return Snapshot(dgd=parse_dgd(dgd_obj), pods=pods() if pod_list == "default" else pod_list,
                    budget=DeploymentBudget(power_limit_w=limit), admitted=admitted, proposal=proposal,
                    group=group, was_rolling=was_rolling, now="2026-11-30T10:00:00Z")


def test_nothing_is_scaled_before_admission_from_a_settled_snapshot():
    pending = evaluate(snap(disagg(status={**settled(), "observedGeneration": 0}), proposal={"prefill": 4}))
    assert pending.status["reason"] == "AwaitingSettlement" and pending.replicas == {} and pending.admit is None
    assert [e.reason for e in pending.status_events] == ["AwaitingSettlement"]
    ok = evaluate(snap(disagg(status=settled()), proposal={"prefill": 4}))
    assert ok.admit is not None and ok.status["reason"] == "Planned"
    # 4 x 700 + 1 x 2400 = 5200 W <= 8000: prefill 2 -> 4, decode left as is
    assert ok.replicas == {"prefill": 4} and ok.status["targets"] == {"prefill": 4}
    assert [e.reason for e in ok.status_events] == ["Planned", "PowerInputsAdmitted"]
    assert [e.message for e in ok.scale_events] == ["prefill replicas 2 -> 4 (prefill)"]


def test_a_changed_annotation_after_admission_fails_closed():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    res = evaluate(snap(disagg(decode_cap="250", status=settled()), admitted=admitted, proposal={"prefill": 4},
                        pod_list=pods("250")))
    assert res.status["ready"] == "False" and res.status["reason"] == "PowerInputsChanged"
    assert res.replicas == {} and "'300' -> '250'" in res.status["message"]


def test_unchanged_status_keeps_its_transition_time_and_queues_no_event():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    first = evaluate(snap(disagg(status=settled()), admitted=admitted))
    again = evaluate(snap(disagg(status=settled()), admitted=admitted), previous={**first.status,
                                                                                 "lastTransitionTime": "earlier"})
    assert again.status == {**first.status, "lastTransitionTime": "earlier"} and again.status_events == []


def test_power_clamp_and_an_over_limit_proposal():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    res = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 10, "decode": 2}, limit=6000))
    assert res.status["settledWatts"] <= 6000 and "power_budget_clamped" in res.status["reasons"]


def test_rolling_or_unreadable_pods_block_scale_ups_and_warn_once_per_stretch():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    rolling = {**settled(prefill={"replicas": 2, "readyReplicas": 2, "updatedReplicas": 1}),
               "rollingUpdate": {"phase": "InProgress", "updatedServices": ["decode"]}}
    res = evaluate(snap(disagg(status=rolling), admitted=admitted, proposal={"prefill": 4}))
    assert res.replicas == {} and res.rolling and len(res.warnings) == 1
    assert res.status["targets"] == {} and res.status["held"] == ["prefill"]
    assert "rollout_scale_up_held" in res.status["reasons"]
    assert evaluate(snap(disagg(status=rolling), admitted=admitted, proposal={"prefill": 4}, was_rolling=True)).warnings == []
    blind = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 4, "decode": 0}, pod_list=None))
    # prefill held (None); decode raised to its minimum 1, which is its count already: no write
    assert blind.replicas == {} and blind.status["targets"] == {"decode": 1}


def test_failed_rollout_is_reported_at_once():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    failed = {**settled(decode={"replicas": 1, "readyReplicas": 1}), "rollingUpdate": {"phase": "Failed"},
              "conditions": [{"type": "Ready", "status": "False", "reason": "pods_not_ready", "message": "crash"}]}
    res = evaluate(snap(disagg(status=failed), admitted=admitted))
    assert res.status["reason"] == "RolloutFailed" and res.status_events[0].type == "Warning"


def test_group_allowance_limits_and_missing_allowance_blocks_growth():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    capped = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 6},
                           group=GroupLimit("rack-a", 5000, minimum_w=3100, current_w=3800)))
    assert capped.status["powerLimitWatts"] == 5000 and capped.replicas == {"prefill": 3}
    blocked = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 6},
                            group=GroupLimit("rack-a", None)))
    assert blocked.replicas == {} and "no allowance" in blocked.status["message"]


def test_a_proposal_for_a_role_the_deployment_lacks_is_reported():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    res = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"worker": 3}))
    assert res.replicas == {} and "proposal for worker ignored" in res.status["message"]


def test_one_evaluation_derives_the_power_inputs_once(monkeypatch):
    import powerfleet.budget.program as program
    import powerfleet.cluster.immutability as immutability
    import powerfleet.cluster.settlement as settlement
    from powerfleet.cluster.power import resolve_power_config

    calls = []

    def counting(dgd, *rest):
        calls.append(dgd.name)
        return resolve_power_config(dgd, *rest)

    for module in (program, immutability, settlement):
        monkeypatch.setattr(module, "resolve_power_config", counting)
    first = evaluate(snap(disagg(status=settled()), proposal={"prefill": 3}))  # settle + admit
    assert first.admit is not None and calls == ["llama"]
    calls.clear()
    evaluate(snap(disagg(status=settled()), admitted=first.admit, proposal={"prefill": 3}))  # drift check + plan
    assert calls == ["llama"]


def test_a_deployment_over_its_allowance_whose_proposal_alone_fits_says_it_is_shrinking():
    # found in bench/budget.py's steady tick: a proposal one replica down that fits the new share is
    # clamped by nothing, and the status said "within budget" beside overBudgetWatts 700
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    res = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 1},
                        group=GroupLimit("rack-a", 3100, minimum_w=3100, current_w=3800, over_share=True)))
    assert res.replicas == {"prefill": 1} and res.status["overBudgetWatts"] == 700, res.status
    assert res.status["reasons"] == ["power_over_budget_shrink"], res.status
    assert res.status["message"] == "power_over_budget_shrink", res.status


def test_a_deployment_below_its_share_only_because_it_asked_for_less_is_not_over_budget():
    # bench/budget.py's steady tick: a share follows its demand, so a proposal one replica down gives
    # a limit below what it holds; that was reported OverBudget (a Warning event and a condition PATCH
    # each) for 316 of 814 deployments that were only shrinking by their own proposal
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    res = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 1},
                        group=GroupLimit("rack-a", 3100, minimum_w=3100, current_w=3800, over_share=False)))
    assert res.replicas == {"prefill": 1}, res.status  # it shrinks as it asked
    assert "overBudgetWatts" not in res.status and res.status["reasons"] == [], res.status
    assert not [e for e in res.status_events if "Budget" in e.reason], res.status_events
    # above its own limit it is over whatever the group says
    own = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 1},
                        limit=3500,
                        group=GroupLimit("rack-a", 3100, minimum_w=3100, current_w=3800, over_share=False)))
    assert own.status["overBudgetWatts"] == 700, own.status


def test_a_deployment_over_its_group_allowance_without_a_proposal_is_reported_and_shrinks():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    # it draws 2 x 700 + 2,400 = 3,800 W; the group allows it 3,100 W (its minimum footprint):
    # a role without a proposal shrinks from its desired count too (issue 30 route 1)
    res = evaluate(snap(disagg(status=settled()), admitted=admitted,
                        group=GroupLimit("rack-a", 3100, minimum_w=3100, current_w=3800, over_share=True)))
    assert res.replicas == {"prefill": 1} and "power_over_budget_shrink" in res.status["reasons"], res.status
    assert res.status["settledWatts"] == 3100 == res.status["powerLimitWatts"]  # once shrunk
    assert res.status["chargeBasis"] == {"prefill": "requested_cap", "decode": "requested_cap"}
    assert res.status_events[0].reason == "Planned"
    # over its share: the status says by how much, and one Warning event marks the transition
    assert res.status["overBudgetWatts"] == 700
    assert [(e.reason, e.type) for e in res.status_events if "Budget" in e.reason] == [("OverBudget", "Warning")]
    assert "3800 W, 700 W above its limit of 3100 W" in next(e.message for e in res.status_events
                                                            if e.reason == "OverBudget")
    again = evaluate(snap(disagg(status=settled()), admitted=admitted,
                          group=GroupLimit("rack-a", 3100, minimum_w=3100, current_w=3800, over_share=True)), res.status)
    assert again.status == res.status and again.status_events == []  # still over: no second event
    back = evaluate(snap(disagg(status=settled()), admitted=admitted,
                         group=GroupLimit("rack-a", 5000, minimum_w=3100, current_w=3800)), again.status)
    assert "overBudgetWatts" not in back.status
    assert [e.reason for e in back.status_events] == ["WithinBudget"]


def test_the_over_budget_gauge_follows_each_evaluation():
    from prometheus_client import REGISTRY

    from powerfleet.budget import metrics

    metrics.record_evaluation("ns/over", "Planned", 3100, 3800, 3800, 4, [], over_w=700)
    assert REGISTRY.get_sample_value("powerfleet_budget_over_budget_watts", {"deployment": "ns/over"}) == 700
    metrics.record_evaluation("ns/over", "Planned", 5000, 3800, 3800, 4, [], over_w=0)
    assert REGISTRY.get_sample_value("powerfleet_budget_over_budget_watts", {"deployment": "ns/over"}) == 0


def test_the_scales_counter_counts_replica_writes_only():
    from prometheus_client import REGISTRY

    from powerfleet.budget import metrics

    def scales() -> float:
        return REGISTRY.get_sample_value("powerfleet_budget_scales_total", {"deployment": "ns/scaled"}) or 0.0

    before = scales()
    metrics.record_evaluation("ns/scaled", "Planned", 5000, 3800, 3800, 4, [], scaled=True)
    metrics.record_evaluation("ns/scaled", "Planned", 5000, 3800, 3800, 4, [])
    assert scales() == before + 1


def _evidence(*reports, now=1000.0, mode="auto", nodes=("gpu-0",), unreadable=False):
    from powerfleet.budget.evidence import Evidence

    by_node: dict = {n: [] for n in nodes}  # nodes whose agent reports (or has reported)
    for r in reports:
        by_node.setdefault("gpu-0", []).append(r)
    return Evidence(by_node, now=now, fresh_s=45.0, max_settable_w=1000, mode=mode, unreadable=unreadable)


def _uid_pods():
    return [p.model_copy(update={"uid": f"uid-{p.name}"}) for p in pods()]


def _good():
    from powerfleet.budget.evidence import GpuReport

    # prefill: 2 pods x 2 GPUs at 350 W; decode: 2 pods (one replica on 2 nodes) x 4 GPUs at 300 W
    return [GpuReport(f"GPU-{p}-{i}", f"uid-{p}", 350 if p.startswith("p") else 300, 200.0, at=990.0)
            for p, n in (("p0", 2), ("p1", 2), ("d0", 4), ("d0w", 4)) for i in range(n)]


def _with(evidence, *, limit=20_000, pod_list=None, proposal=None):
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    return evaluate(replace(snap(disagg(status=settled()), admitted=admitted, proposal=proposal or {"prefill": 3},
                                 pod_list=pod_list or _uid_pods(), limit=limit), evidence=evidence))


def test_fresh_evidence_charges_each_gpu_at_its_enforced_limit_and_lets_scale_ups_go():
    fresh = _with(_evidence(*_good()))
    assert fresh.replicas == {"prefill": 3} and fresh.status["chargeBasis"] == {"prefill": "enforced", "decode": "enforced"}
    assert fresh.status["settledWatts"] == 3 * 700 + 2400 and "unenforcedWatts" not in fresh.status
    # an enforced limit above the cap (the device minimum, say) is what the GPU may draw: charged
    from powerfleet.budget.evidence import GpuReport
    above = _with(_evidence(*_good()[:-1], GpuReport("GPU-d0w-3", "uid-d0w", 400, 200.0, at=990.0)))
    assert above.replicas == {"prefill": 3} and above.status["chargeBasis"]["decode"] == "enforced"
    assert above.status["unenforcedWatts"] == 100 and above.status["settledWatts"] == 3 * 700 + 2400 + 100


def test_a_gpu_without_fresh_evidence_is_charged_its_maximum_settable_limit_and_holds_scale_ups():
    # d0w's last GPU has no report: only d0w's 4 GPUs go to 1,000 W (4 x 700 W more), scale-ups held
    missing = _with(_evidence(*_good()[:-1]))
    assert missing.replicas == {} and "enforcement_evidence_stale" in missing.status["reasons"]
    assert missing.status["held"] == ["prefill"] and "pod d0w on gpu-0: 3 of 4 GPUs" in missing.status["message"]
    assert missing.status["chargeBasis"] == {"prefill": "enforced", "decode": "max_settable"}
    assert missing.status["unenforcedWatts"] == 2800 and missing.status["settledWatts"] == 2 * 700 + 2400 + 2800
    # older than three intervals: stale; the agent still publishes, but not for this pod: stale too
    old = _with(_evidence(*_good(), now=1100.0))
    assert old.replicas == {} and old.status["chargeBasis"] == {"prefill": "max_settable", "decode": "max_settable"}
    assert old.status["unenforcedWatts"] == 4 * 650 + 8 * 700
    other_pod = _with(_evidence(*[r.__class__(r.gpu_uuid, "uid-someone-else", r.enforced_w, 0.0, r.at) for r in _good()]))
    assert other_pod.replicas == {} and other_pod.status["chargeBasis"]["prefill"] == "max_settable"
    # a node whose agent reported before and now publishes nothing (its hash expired): stale
    silent = _with(_evidence())
    assert silent.replicas == {} and silent.status["unenforcedWatts"] == 4 * 650 + 8 * 700
    # unreadable reports: no evidence anywhere
    lost = _with(_evidence(nodes=(), unreadable=True))
    assert lost.replicas == {} and lost.status["chargeBasis"]["decode"] == "max_settable"


def test_where_no_agent_ever_reported_the_requested_cap_is_charged_unless_evidence_is_required():
    none = _with(_evidence(nodes=()))  # auto: no agent on gpu-0
    assert none.replicas == {"prefill": 3} and none.status["chargeBasis"] == {"prefill": "requested_cap",
                                                                             "decode": "requested_cap"}
    required = _with(_evidence(nodes=(), mode="required"))
    assert required.replicas == {} and "enforcement_evidence_stale" in required.status["reasons"]
    off = _with(_evidence(nodes=(), mode="off"))
    assert off.replicas == {"prefill": 3} and off.status["chargeBasis"]["prefill"] == "requested_cap"


def test_a_pod_not_yet_running_keeps_its_requested_cap_and_stale_watts_shrink_only_proposed_roles():
    # a Pending pod has nothing for an agent to attribute: it is not judged (its role is in flight)
    pending = [p.model_copy(update={"phase": "Pending"}) if p.name == "d0w" else p for p in _uid_pods()]
    got = _with(_evidence(*_good()[:-4]), pod_list=pending)
    assert got.status["chargeBasis"]["decode"] == "enforced" and "unenforcedWatts" not in got.status
    # 6,000 W limit: prefill 2 x 700 + decode 2,400 fits, but d0w's stale 2,800 W does not: the
    # proposed role shrinks to its minimum, the unproposed one is left as is, and it is reported
    tight = _with(_evidence(*_good()[:-1]), limit=6000)
    assert tight.replicas == {"prefill": 1} and tight.status["settledWatts"] == 700 + 2400 + 2800


def test_a_clamp_reason_appearing_is_in_the_status_and_sends_no_event():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    first = evaluate(snap(disagg(status=settled()), admitted=admitted))
    clamped = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"prefill": 20}), first.status)
    assert clamped.status["reasons"] == ["power_budget_clamped"] and clamped.status["reason"] == "Planned"
    assert clamped.status_events == [], clamped.status_events  # before: a BudgetReasons event each time
