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


def test_a_deployment_over_its_group_allowance_without_a_proposal_is_reported_and_left_alone():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    # it draws 2 x 700 + 2,400 = 3,800 W; the group allows it 3,100 W (its minimum footprint)
    res = evaluate(snap(disagg(status=settled()), admitted=admitted,
                        group=GroupLimit("rack-a", 3100, minimum_w=3100, current_w=3800)))
    assert res.replicas == {} and "power_over_budget_unremedied" in res.status["reasons"]
    assert res.status["settledWatts"] == 3800 > res.status["powerLimitWatts"] == 3100
    assert res.status["chargeBasis"] == {"prefill": "requested_cap", "decode": "requested_cap"}
    assert res.status_events[0].reason == "Planned"


def _evidence(*reports, now=1000.0):
    from powerfleet.budget.evidence import Evidence

    by_node: dict = {}
    for r in reports:
        by_node.setdefault("gpu-0", []).append(r)
    return Evidence(by_node, now=now, fresh_s=45.0, max_settable_w=1000)


def _uid_pods():
    return [p.model_copy(update={"uid": f"uid-{p.name}"}) for p in pods()]


def test_enforcement_evidence_charges_the_cap_only_while_fresh_and_matching():
    from powerfleet.budget.evidence import GpuReport

    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    # prefill: 2 pods x 2 GPUs at 350 W; decode: 2 pods (one replica on 2 nodes) x 4 GPUs at 300 W
    good = [GpuReport(f"GPU-{p}-{i}", f"uid-{p}", 350 if p.startswith("p") else 300, 200.0, at=990.0)
            for p, n in (("p0", 2), ("p1", 2), ("d0", 4), ("d0w", 4)) for i in range(n)]
    base = dict(admitted=admitted, proposal={"prefill": 3}, pod_list=_uid_pods(), limit=20_000)
    fresh = evaluate(replace(snap(disagg(status=settled()), **base), evidence=_evidence(*good)))
    assert fresh.replicas == {"prefill": 3} and fresh.status["chargeBasis"] == {"prefill": "enforced", "decode": "enforced"}
    # a decode GPU without a report: decode charged at 1,000 W x 4 GPUs x 2 nodes, scale-ups held
    missing = evaluate(replace(snap(disagg(status=settled()), **base), evidence=_evidence(*good[:-1])))
    assert missing.replicas == {} and "enforcement_evidence_stale" in missing.status["reasons"]
    assert missing.status["chargeBasis"]["decode"] == "max_settable"
    assert missing.status["settledWatts"] == 2 * 700 + 8000
    # stale (older than three intervals) or enforcing another value than the requested cap: no evidence either
    old = evaluate(replace(snap(disagg(status=settled()), **base), evidence=_evidence(*good, now=1100.0)))
    assert old.replicas == {} and old.status["chargeBasis"] == {"prefill": "max_settable", "decode": "max_settable"}
    wrong = [*good[:-1], GpuReport("GPU-d0w-3", "uid-d0w", 400, 200.0, at=990.0)]
    mismatch = evaluate(replace(snap(disagg(status=settled()), **base), evidence=_evidence(*wrong)))
    assert mismatch.replicas == {} and "enforces 400 W, not the requested 300 W" in mismatch.status["message"]
