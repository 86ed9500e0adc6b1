"""The ledger charges what physically holds GPUs (issue 18 item 1), in one deployment's program
and in a group's current draw (issue 24: surge pods, a deployment's own limit in its share)."""

from __future__ import annotations

import copy

from powerfleet.budget.fleet import DeploymentView, member
from powerfleet.budget.groups import Member, allocate
from powerfleet.budget.program import DeploymentBudget, evaluate
from powerfleet.cluster.dgd import parse_dgd
from powerfleet.cluster.immutability import admit_power_inputs
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.power import resolve_power_config
from tests.budget.test_program import pods, settled, snap
from tests.cluster.builders import disagg, pod_obj

# prefill: 700 W per replica (2 ready); decode: 2,400 W per replica (2 pods of 2 nodes each)


def scaling_decode(ready: int = 1, **decode_status):
    """decode's spec raised 1 -> 2 while only one replica is ready (no rollout phase written)."""
    obj = disagg(status=settled(decode={"replicas": 2, "readyReplicas": ready, "updatedReplicas": 2, **decode_status}))
    obj["spec"]["components"][2]["replicas"] = 2
    return obj


def info(name: str, comp: str, *, terminating: bool = False, phase: str = "Running") -> PodInfo:
    m = pod_obj(name, comp=comp, cap="350" if comp == "prefill" else "300")["metadata"]
    return PodInfo(name=name, namespace="default", labels=m["labels"], annotations=m["annotations"], phase=phase,
                   node_name="gpu-0", terminating=terminating)


def test_an_in_flight_scale_up_is_charged_and_holds_the_peers_scale_up():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    res = evaluate(snap(scaling_decode(), admitted=admitted, proposal={"prefill": 6}))
    # today's rule wrote prefill 6 and reported 6,600 W; decode's second replica then makes it 9,000 W
    assert res.replicas == {} and res.status["settledWatts"] == 2 * 700 + 2 * 2400 <= 8000
    assert res.status["held"] == ["prefill"] and res.rolling
    assert res.status["peakGpus"] == 2 * 2 + 2 * 8  # prefill 2 x 2 GPUs, decode 2 x (4 GPUs x 2 nodes)
    assert any("decode: 1 ready" in w for w in res.warnings)
    # once decode's replica is ready the hold lifts, and prefill grows into what is left: 4 x 700 + 4,800
    done = evaluate(snap(scaling_decode(ready=2), admitted=admitted, proposal={"prefill": 6}, pod_list=pods() + [
        info("d1", "decode"), info("d1w", "decode")]))
    assert done.replicas == {"prefill": 4} and done.status["settledWatts"] == 7600


def test_surge_and_terminating_pods_count_in_the_program():
    admitted = admit_power_inputs(parse_dgd(disagg(status=settled())))
    # prefill spec 2, ready 2, but a third (surge) pod exists, and an old one is still terminating
    surge = pods() + [info("p2", "prefill"), info("p-old", "prefill", terminating=True),
                      info("p-done", "prefill", phase="Succeeded")]
    res = evaluate(snap(disagg(status=settled()), admitted=admitted, proposal={"decode": 2}, pod_list=surge))
    assert res.replicas == {} and res.status["settledWatts"] == 4 * 700 + 2400  # decode's scale-up held


def _view(obj, pod_list, proposal=None):
    d = parse_dgd(obj)
    return DeploymentView(key="default/llama", dgd=d, admitted=None, budget=DeploymentBudget(power_limit_w=20_000),
                          proposal=proposal, pods=pod_list)


def test_a_groups_current_draw_counts_surge_pods_beyond_the_replicas():
    obj = disagg(status=settled())
    power = resolve_power_config(parse_dgd(obj))
    base = member(_view(obj, pods()), power)
    assert base.current_w == 2 * 700 + 2400
    # more pods than replicas: 3 prefill pods for 2 replicas, decode's 2-node replica plus a surge pod
    more = member(_view(obj, pods() + [info("p2", "prefill"), info("d1", "decode")]), power)
    assert more.current_w == 3 * 700 + 2 * 2400
    # the unproposed roles' demand is their charge too
    assert more.demand_w == more.current_w
    # an in-flight spec count is charged before any pod exists
    spec = copy.deepcopy(obj)
    spec["spec"]["components"][2]["replicas"] = 3
    assert member(_view(spec, pods()), power).current_w == 2 * 700 + 3 * 2400


def test_a_share_respects_each_deployments_own_limit():
    # an 8,000 W rack; a is limited to 2,000 W, b to 10,000 W; both want 6,000 W
    res = allocate(8000, {"a": Member(minimum_w=500, demand_w=6000, current_w=500, own_limit_w=2000),
                          "b": Member(minimum_w=500, demand_w=6000, current_w=500, own_limit_w=10_000)})
    assert res.allowances["a"].share_w == 2000 and res.allowances["b"].share_w == 6000
    assert res.allowances["a"].limit_w == 2000 and res.allowances["b"].limit_w == 6000
