from __future__ import annotations

import pytest

from powerfleet.cluster.dgd import parse_dgd
from powerfleet.cluster.errors import PowerInputError
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.power import Role
from powerfleet.cluster.dgd import RolloutPhase
from powerfleet.cluster.settlement import SettlementState, partition_pods, settle
from tests.cluster.builders import disagg, pod_obj


def done(**overrides):
    comps = {
        "prefill": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2},
        "decode": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1},
    }
    comps.update(overrides)
    return {"observedGeneration": 1, "rollingUpdate": {"phase": "Completed"}, "components": comps}


def info(obj, *, terminating=False):
    m = obj["metadata"]
    return PodInfo(name=m["name"], namespace=m["namespace"], labels=m["labels"], annotations=m["annotations"],
                   phase=obj["status"]["phase"], node_name=obj["spec"]["nodeName"], terminating=terminating)


def pods(prefill_cap="350", decode_cap="300"):
    return [
        info(pod_obj("prefill-0", comp="prefill", cap=prefill_cap)),
        info(pod_obj("prefill-1", comp="prefill", cap=prefill_cap)),
        info(pod_obj("decode-0-leader", comp="decode", cap=decode_cap)),
        info(pod_obj("decode-0-worker", comp="decode", cap=decode_cap)),  # nodeCount 2
        info(pod_obj("fe-0", comp="frontend", cap=None)),
        info(pod_obj("other-0", dgd="other", comp="decode", cap="1")),
    ]


def test_settled_returns_caps():
    s = settle(parse_dgd(disagg(status=done())), pods())
    assert s.state is SettlementState.SETTLED and s.settled and s.reasons == ()
    assert s.power.roles[Role.DECODE].watts_per_replica == 2400


def test_verbatim_annotation_is_required():
    dgd = parse_dgd(disagg(decode_cap=" 300 ", status=done()))
    assert settle(dgd, pods(decode_cap=" 300 ")).settled
    s = settle(dgd, pods(decode_cap="300"))
    assert s.state is SettlementState.PENDING
    assert any("pod decode-0-leader has dynamo.nvidia.com/gpu-power-limit='300', expected ' 300 '" in r for r in s.reasons)


def test_failed_rollout_is_reported_at_once():
    # Dynamo reports a failure deployment-wide (rollingUpdate.phase) with the Ready condition's message.
    st = {**done(decode={"readyReplicas": 0}), "rollingUpdate": {"phase": "Failed", "updatedServices": ["prefill"]},
          "conditions": [{"type": "Ready", "status": "False", "reason": "pods_not_ready", "message": "ImagePullBackOff"}]}
    s = settle(parse_dgd(disagg(status=st)), [])
    assert s.state is SettlementState.FAILED and s.reasons == ("deployment rollout failed: ImagePullBackOff",)
    dgd = parse_dgd(disagg(status=st))
    assert dgd.status.components["decode"].rollout is RolloutPhase.FAILED
    assert dgd.status.components["decode"].message == "ImagePullBackOff"
    assert dgd.status.components["prefill"].rollout is RolloutPhase.COMPLETED


@pytest.mark.parametrize(
    ("status", "pod_list", "reason"),
    [
        (None, pods(), "component 'prefill': no status yet"),
        ({**done(), "rollingUpdate": {"phase": "InProgress", "updatedComponents": ["decode"]}}, pods(),
         "component 'prefill': rollout InProgress"),
        (done(prefill={"replicas": 2, "readyReplicas": 1}), pods(), "1 of 2 replicas ready"),
        ({**done(), "observedGeneration": 0}, pods(), "observedGeneration 0 is behind generation 1"),
        ({**done(), "rollingUpdate": {"phase": "Pending"}}, pods(), "deployment rollout Pending"),
        (done(), pods()[1:], "component 'prefill': 1 live pods, expected 2"),
        (done(), [*pods(), info(pod_obj("prefill-old", comp="prefill", cap="400"), terminating=True)],
         "pods still terminating: prefill-old"),
    ],
)
def test_pending_reasons(status, pod_list, reason):
    s = settle(parse_dgd(disagg(status=status)), pod_list)
    assert s.state is SettlementState.PENDING and s.power is None
    assert any(reason in r for r in s.reasons), s.reasons


def test_finished_pods_do_not_count():
    extra = info(pod_obj("prefill-done", comp="prefill", cap="1", phase="Succeeded"))
    assert settle(parse_dgd(disagg(status=done())), [*pods(), extra]).settled


def test_partition_is_local_and_scoped():
    parts = partition_pods(parse_dgd(disagg()), pods())
    assert {k: len(v) for k, v in parts.items()} == {"frontend": 1, "prefill": 2, "decode": 2}


def test_invalid_power_inputs_raise():
    with pytest.raises(PowerInputError):
        settle(parse_dgd(disagg(decode_cap="abc", status=done())), pods())


def test_observed_generation_ahead_of_generation_settles():
    # a controller that already saw a later write reports a newer generation than we read
    assert settle(parse_dgd(disagg(status={**done(), "observedGeneration": 2})), pods()).settled
    missing = {k: v for k, v in done().items() if k != "observedGeneration"}
    assert settle(parse_dgd(disagg(status=missing)), pods()).state is SettlementState.PENDING
