from __future__ import annotations

import copy

from powerfleet.cluster.dgd import parse_dgd
from powerfleet.cluster.immutability import (
    AdmittedPowerInputs,
    admit_power_inputs,
    check_power_inputs_unchanged,
    validate_dgd_update,
)
from tests.cluster.builders import component, dgd_obj, disagg

CAP = "spec.components[name=decode].podTemplate.metadata.annotations[dynamo.nvidia.com/gpu-power-limit]"


def comps(obj, name):
    return next(c for c in obj["spec"]["components"] if c["name"] == name)


def check(old, new):
    return validate_dgd_update(parse_dgd(old), parse_dgd(new))


def test_unchanged_and_replica_changes_are_allowed():
    old = disagg()
    new = copy.deepcopy(old)
    comps(new, "decode")["replicas"] = 7
    assert check(old, new) == []


def test_reordered_components_are_matched_by_name():
    old = disagg()
    new = copy.deepcopy(old)
    new["spec"]["components"].reverse()
    assert check(old, new) == []
    comps(new, "decode")["podTemplate"]["metadata"]["annotations"]["dynamo.nvidia.com/gpu-power-limit"] = "250"
    [v] = check(old, new)
    assert (v.path, v.old, v.new, v.component) == (CAP, "300", "250", "decode")
    assert v.line() == f"{CAP}: '300' -> '250'"


def test_whitespace_change_is_a_change():
    [v] = check(disagg(decode_cap="300"), disagg(decode_cap=" 300 "))
    assert (v.old, v.new) == ("300", " 300 ")


def test_annotation_removed_or_added():
    [v] = check(disagg(), disagg(decode_cap=None))
    assert (v.path, v.old, v.new) == (CAP, "300", None)
    assert v.line().endswith("'300' -> <absent>")
    [v] = check(disagg(decode_cap=None), disagg())
    assert (v.old, v.new) == (None, "300")


def test_gpu_count_via_limits_vs_requests():
    old = dgd_obj(component("decode", "decode", cap="300", gpus="4", via="limits"))
    same = dgd_obj(component("decode", "decode", cap="300", gpus=4, via="requests"))
    assert check(old, same) == []
    more = dgd_obj(component("decode", "decode", cap="300", gpus="8", via="requests"))
    [v] = check(old, more)
    assert v.path == "spec.components[name=decode].podTemplate.spec.containers[name=main].resources.requests[nvidia.com/gpu]"
    assert (v.old, v.new) == (4, 8)
    # limits take precedence over requests: adding a different limit changes the effective count
    both = dgd_obj(component("decode", "decode", cap="300", gpus="4", via="requests"))
    both["spec"]["components"][0]["podTemplate"]["spec"]["containers"][1]["resources"]["limits"] = {"nvidia.com/gpu": "2"}
    [v] = check(same, both)
    assert v.path.endswith("resources.limits[nvidia.com/gpu]") and (v.old, v.new) == (4, 2)


def test_node_count_added_removed_changed():
    base = dgd_obj(component("decode", "decode", cap="300"))
    one = dgd_obj(component("decode", "decode", cap="300", node_count=1))
    two = dgd_obj(component("decode", "decode", cap="300", node_count=2))
    path = "spec.components[name=decode].multinode.nodeCount"
    # effective values compare (absent = 1); the raw value is reported (absent = None)
    assert check(base, one) == [] and check(one, base) == []
    assert [(v.path, v.old, v.new) for v in check(two, base)] == [(path, 2, None)]
    assert check(two, base)[0].line() == f"{path}: 2 -> <absent>"
    assert [(v.path, v.old, v.new) for v in check(one, two)] == [(path, 1, 2)]


def test_unannotated_components_may_change():
    old = dgd_obj(component("fe", "frontend", gpus=None), component("w", "worker", cap="1"))
    new = dgd_obj(component("fe", "frontend", gpus="1", node_count=3), component("w", "worker", cap="1"))
    assert check(old, new) == []


def test_services_form_paths():
    def svc(cap, gpu):
        return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": "a"},
                "spec": {"services": {"W": {"componentType": "worker", "resources": {"limits": {"gpu": gpu}},
                                             "extraPodMetadata": {"annotations": {"dynamo.nvidia.com/gpu-power-limit": cap}}}}}}
    paths = [v.path for v in check(svc("300", "1"), svc("200", "2"))]
    assert paths == ["spec.services[W].extraPodMetadata.annotations[dynamo.nvidia.com/gpu-power-limit]",
                     "spec.services[W].resources.limits.gpu"]


def test_admitted_inputs_fail_closed_until_readmitted():
    admitted = admit_power_inputs(parse_dgd(disagg()))
    # persisted and loaded back (JSON) by a planner
    admitted = AdmittedPowerInputs.model_validate_json(admitted.model_dump_json())
    assert check_power_inputs_unchanged(admitted, parse_dgd(disagg())) == []
    changed = parse_dgd(disagg(decode_cap="250"))
    [v] = check_power_inputs_unchanged(admitted, changed)
    assert v.path == CAP
    readmitted = admit_power_inputs(changed)
    assert check_power_inputs_unchanged(readmitted, changed) == []
    assert readmitted.power.roles["decode"].watts_per_replica == 250 * 4 * 2


def test_admitted_detects_removed_component_uid_and_broken_inputs():
    admitted = admit_power_inputs(parse_dgd(disagg(name="llama")))
    obj = disagg()
    obj["spec"]["components"] = [c for c in obj["spec"]["components"] if c["name"] != "decode"]
    assert [(v.path, v.new) for v in check_power_inputs_unchanged(admitted, parse_dgd(obj))] == [
        ("spec.components[name=decode]", None)]
    a2 = admit_power_inputs(parse_dgd({**disagg(), "metadata": {"name": "llama", "uid": "u1"}}))
    [v] = check_power_inputs_unchanged(a2, parse_dgd({**disagg(), "metadata": {"name": "llama", "uid": "u2"}}))
    assert v.path == "metadata.uid"
    extra = disagg()
    extra["spec"]["components"].append(component("w", "worker", cap="100"))
    [v] = check_power_inputs_unchanged(admitted, parse_dgd(extra))
    assert v.component == "w" and v.old is None and v.new == "100"
