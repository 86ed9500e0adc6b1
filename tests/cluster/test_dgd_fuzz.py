"""The DGD parser and the role resolver on random input: a result or one DGDInputError, nothing else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.cluster.dgd import POWER_ANNOTATION, parse_dgd
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.immutability import admit_power_inputs, check_power_inputs_unchanged, validate_dgd_update
from powerfleet.cluster.power import resolve_power_config

junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 9), st.text(max_size=6), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def mostly(valid: st.SearchStrategy, rare: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` 19 times in 20, else ``rare``: invalid input without drowning the valid paths."""
    return st.integers(0, 19).flatmap(lambda i: rare if i == 0 else valid)


types = mostly(st.one_of(st.sampled_from(["frontend", "worker", "prefill", "decode", "planner", "epp", "default",
                                          "main"]), st.none()), junk)
names = st.sampled_from(["Frontend", "VllmPrefillWorker", "VllmDecodeWorker", "decode", "prefill", "worker",
                         "engine", "prefill-decode"])
gpus = mostly(st.one_of(st.integers(0, 8), st.sampled_from(["1", "2", "0", " 4 "]), st.none()),
              st.one_of(st.sampled_from(["1.5", "2Gi"]), junk))
caps = mostly(st.sampled_from(["300", " 350 ", "300", None]), st.one_of(st.sampled_from(["0", "abc", ""]), junk))
replicas = mostly(st.integers(0, 5), junk)


@st.composite
def component_list_item(draw):
    res = {draw(st.sampled_from(["limits", "requests"])): {"nvidia.com/gpu": draw(gpus)}}
    if draw(st.integers(0, 4)) == 0:
        res["claims"] = draw(mostly(st.just([{"name": "gpu"}]), junk))
    item = {"name": draw(names), "replicas": draw(replicas),
            "podTemplate": {"metadata": {"annotations": {POWER_ANNOTATION: draw(caps)}},
                            "spec": {"containers": [{"name": draw(st.sampled_from(["main", "sidecar"])), "resources": res}]}}}
    t = draw(types)
    if t is not None:
        item["type"] = t
    if draw(st.booleans()):
        item["multinode"] = {"nodeCount": draw(mostly(st.integers(0, 4), junk))}
    if draw(st.integers(0, 4)) == 0:
        item["podTemplate"]["spec"]["resourceClaims"] = [{"name": "gpu"}]
    return item


@st.composite
def service(draw):
    svc = {"componentType": draw(types),
           "subComponentType": draw(mostly(st.sampled_from([None, None, "prefill", "decode"]), junk)),
           "replicas": draw(replicas),
           "extraPodMetadata": {"annotations": {POWER_ANNOTATION: draw(caps)}}}
    if draw(st.integers(0, 3)) > 0:
        svc["resources"] = {"limits": {"gpu": draw(gpus)}}
    return {k: v for k, v in svc.items() if v is not None}


dgds = st.one_of(
    st.builds(lambda comps: {"apiVersion": "nvidia.com/v1beta1", "metadata": {"name": "d"}, "spec": {"components": comps}},
              st.lists(component_list_item(), max_size=4, unique_by=lambda c: c["name"])),
    st.builds(lambda svcs: {"apiVersion": "nvidia.com/v1alpha1", "metadata": {"name": "d"}, "spec": {"services": svcs}},
              st.dictionaries(names, service(), max_size=4)),
)


@settings(max_examples=1500, deadline=None)
@given(dgds, dgds)
def test_parse_resolve_and_compare_raise_only_dgd_input_errors(a, b):
    try:
        old = parse_dgd(a)
    except DGDInputError as exc:
        assert exc.path and "\n" not in str(exc)
        return
    try:
        cfg = resolve_power_config(old)
    except DGDInputError as exc:
        assert exc.path and "\n" not in str(exc)
    else:
        assert all(rp.watts_per_replica > 0 for rp in cfg.roles.values())
        assert cfg.mode == ("agg" if len(cfg.roles) == 1 else "disagg")
        admitted = admit_power_inputs(old)
        assert check_power_inputs_unchanged(admitted, old) == []
    try:
        new = parse_dgd(b)
    except DGDInputError:
        return
    for v in validate_dgd_update(old, new):
        assert v.line().startswith(v.path)
    assert validate_dgd_update(old, old) == []
