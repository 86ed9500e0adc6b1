from __future__ import annotations

import pytest

from powerfleet.cluster.dgd import ComponentType, RolloutPhase, parse_dgd
from powerfleet.cluster.errors import DGDFormatError
from powerfleet.cluster.power import Role, resolve_power_config
from tests.cluster.builders import disagg


def test_components_form():
    dgd = parse_dgd(disagg(status={"observedGeneration": 1}))
    assert dgd.form == "components" and [c.name for c in dgd.components] == ["frontend", "prefill", "decode"]
    prefill, decode = dgd.component("prefill"), dgd.component("decode")
    assert prefill.type is ComponentType.PREFILL and prefill.replicas == 2
    assert (prefill.gpus_per_pod, prefill.gpu_source) == (2, "limits")
    assert (decode.gpus_per_pod, decode.gpu_source, decode.node_count) == (4, "requests", 2)
    assert prefill.labels == {"team": "llm"}
    assert decode.gpu_path == "spec.components[name=decode].podTemplate.spec.containers[name=main].resources.requests[nvidia.com/gpu]"
    assert dgd.pod_selector == "nvidia.com/dynamo-graph-deployment-name=llama"


def test_limits_win_over_requests_and_first_container_fallback():
    obj = disagg()
    main = obj["spec"]["components"][1]["podTemplate"]["spec"]["containers"][1]
    main["resources"] = {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "8"}}
    assert parse_dgd(obj).component("prefill").gpus_per_pod == 2
    obj["spec"]["components"][1]["podTemplate"]["spec"]["containers"] = [
        {"name": "engine", "resources": {"limits": {"nvidia.com/gpu": 3}}}
    ]
    c = parse_dgd(obj).component("prefill")
    assert c.gpus_per_pod == 3 and "containers[name=engine]" in c.gpu_path


def test_services_map_form():
    obj = {
        "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
        "metadata": {"name": "agg", "namespace": "ns"},
        "spec": {"services": {
            "Frontend": {"componentType": "frontend"},
            "VllmWorker": {
                "componentType": "worker", "replicas": 3,
                "resources": {"limits": {"gpu": "2"}},
                "extraPodSpec": {"mainContainer": {"resources": {"limits": {"nvidia.com/gpu": "8"}}}},
                "extraPodMetadata": {"annotations": {"dynamo.nvidia.com/gpu-power-limit": "250"}},
                "multinode": {"nodeCount": 2},
            },
        }},
    }
    dgd = parse_dgd(obj)
    assert dgd.form == "services" and dgd.namespace == "ns"
    w = dgd.component("VllmWorker")
    assert (w.gpus_per_pod, w.gpu_path) == (2, "spec.services[VllmWorker].resources.limits.gpu")
    cfg = resolve_power_config(dgd)
    assert cfg.roles[Role.WORKER].watts_per_replica == 250 * 2 * 2
    del obj["spec"]["services"]["VllmWorker"]["resources"]
    assert parse_dgd(obj).component("VllmWorker").gpus_per_pod == 8


def test_status_subset():
    dgd = parse_dgd(disagg(status={
        "observedGeneration": 1, "state": "pending",
        "rollingUpdate": {"phase": "InProgress", "updatedComponents": ["prefill"]},
        "conditions": [{"type": "Ready", "status": "False", "reason": "updating", "message": "rolling decode"}],
        "components": {"decode": {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1,
                                  "rollout": {"phase": "Failed", "message": "made up"}},
                       "prefill": {"readyReplicas": "2"},
                       "grove": {"replicas": 1, "availableReplicas": 1},
                       "junk": "not an object"},
    }))
    s = dgd.status
    assert s.observed_generation == 1 and s.rollout is RolloutPhase.IN_PROGRESS and s.state == "pending"
    assert s.rollout_message == "rolling decode" and s.updated_components == ("prefill",)
    # Fields Dynamo's CRD does not declare (a per-component rollout) are not read.
    assert s.components["decode"].rollout is RolloutPhase.IN_PROGRESS and s.components["decode"].message == ""
    assert s.components["prefill"].ready_replicas == 2 and s.components["prefill"].rollout is RolloutPhase.COMPLETED
    assert s.components["grove"].ready_replicas == 1 and s.components["grove"].available_replicas == 1
    assert "junk" not in s.components
    no_list = parse_dgd(disagg(status={"rollingUpdate": {"phase": "InProgress"}, "services": {"decode": {"replicas": 1}}}))
    assert no_list.status.rollout is RolloutPhase.IN_PROGRESS and no_list.status.components["decode"].rollout is None


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda o: o["metadata"].pop("name"), "metadata.name"),
        (lambda o: o.__setitem__("spec", {}), "spec.components"),
        (lambda o: o["spec"].__setitem__("components", {"a": 1}), "spec.components"),
        (lambda o: o["spec"]["components"][0].pop("name"), "spec.components[0].name"),
        (lambda o: o["spec"]["components"][0].__setitem__("type", "router"), "spec.components[name=frontend].type"),
        (lambda o: o["spec"]["components"].append(dict(o["spec"]["components"][0])), "spec.components[name=frontend]"),
        (lambda o: o["spec"]["components"][1].__setitem__("replicas", -1), "spec.components[name=prefill].replicas"),
        (lambda o: o["spec"]["components"][1]["podTemplate"]["metadata"]["annotations"].__setitem__(
            "dynamo.nvidia.com/gpu-power-limit", 350),
         "spec.components[name=prefill].podTemplate.metadata.annotations[dynamo.nvidia.com/gpu-power-limit]"),
    ],
)
def test_format_errors_name_the_path(mutate, path):
    obj = disagg()
    mutate(obj)
    with pytest.raises(DGDFormatError) as info:
        parse_dgd(obj)
    assert info.value.path == path


def test_available_replicas_stand_in_for_ready_on_scaling_groups():
    dgd = parse_dgd(disagg(status={"components": {
        "decode": {"componentKind": "PodCliqueScalingGroup", "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2},
        "prefill": {"componentKind": "PodClique", "replicas": 2, "readyReplicas": 1, "availableReplicas": 2}}}))
    assert dgd.status.components["decode"].ready_replicas == 2
    assert dgd.status.components["prefill"].ready_replicas == 1  # readyReplicas wins where present
