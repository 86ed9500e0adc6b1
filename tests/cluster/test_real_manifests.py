"""The cluster layer on DGD manifests from NVIDIA Dynamo's own repository (fixtures/real/README.md)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from powerfleet.cluster.dgd import POWER_ANNOTATION, ComponentType, parse_dgd
from powerfleet.cluster.errors import PowerInputError
from powerfleet.cluster.immutability import validate_dgd_update
from powerfleet.cluster.manifests import ManifestError, dgd_documents, load_document
from powerfleet.cluster.power import Role, is_worker_like, resolve_power_config

REAL = Path(__file__).parent / "fixtures" / "real"


def load(name: str) -> dict[str, Any]:
    [doc] = dgd_documents((REAL / name).read_text())
    return doc


def annotate(obj: dict[str, Any], cap: str = "300") -> dict[str, Any]:
    """Put the cap on every worker-like component, as an operator opting in would."""
    out = copy.deepcopy(obj)
    dgd = parse_dgd(out)
    for comp in dgd.components:
        if not is_worker_like(comp):
            continue
        if dgd.form == "services":
            meta = out["spec"]["services"][comp.name].setdefault("extraPodMetadata", {})
        else:
            item = next(c for c in out["spec"]["components"] if c["name"] == comp.name)
            meta = item.setdefault("podTemplate", {}).setdefault("metadata", {})
        meta.setdefault("annotations", {})[POWER_ANNOTATION] = cap
    return out


# fixture -> (mode, {role: (component, watts per replica at 300 W/GPU)}) or (error component, message part)
RESOLVES = {
    "v1alpha1_vllm_disagg.yaml": ("disagg", {Role.PREFILL: ("VllmPrefillWorker", 300), Role.DECODE: ("VllmDecodeWorker", 300)}),
    "v1alpha1_vllm_agg.yaml": ("agg", {Role.WORKER: ("VllmDecodeWorker", 300)}),
    "v1alpha1_vllm_gaie_disagg.yaml": ("disagg", {Role.PREFILL: ("VllmPrefillWorker", 300), Role.DECODE: ("VllmDecodeWorker", 300)}),
    "v1alpha1_vllm_disagg_planner.yaml": ("disagg", {Role.PREFILL: ("VllmPrefillWorker", 300), Role.DECODE: ("VllmDecodeWorker", 300)}),
    "v1alpha1_sglang_disagg_multinode.yaml": ("disagg", {Role.PREFILL: ("prefill", 300 * 4 * 2), Role.DECODE: ("decode", 300 * 4 * 2)}),
    "v1alpha1_planner_agg_main.yaml": ("agg", {Role.WORKER: ("VllmDecodeWorker", 300)}),
    "v1beta1_vllm_disagg.yaml": ("disagg", {Role.PREFILL: ("VllmPrefillWorker", 300), Role.DECODE: ("VllmDecodeWorker", 300)}),
    "v1beta1_vllm_agg.yaml": ("agg", {Role.WORKER: ("VllmDecodeWorker", 300)}),
    "v1beta1_vllm_disagg_multinode.yaml": ("disagg", {Role.PREFILL: ("prefill", 600), Role.DECODE: ("decode", 600)}),
    "v1beta1_vllm_gaie_disagg.yaml": ("disagg", {Role.PREFILL: ("VllmPrefillWorker", 300), Role.DECODE: ("VllmDecodeWorker", 300)}),
    "v1beta1_vllm_disagg_planner.yaml": ("disagg", {Role.PREFILL: ("VllmPrefillWorker", 300), Role.DECODE: ("VllmDecodeWorker", 300)}),
    "v1beta1_untyped_workers.yaml": ("disagg", {Role.PREFILL: ("VllmPrefillWorker", 300), Role.DECODE: ("VllmDecodeWorker", 600)}),
}
REFUSED = {
    "v1alpha1_mocker_agg.yaml": ("decode", "requests no nvidia.com/gpu"),
    "v1alpha1_global_planner_prefill.yaml": ("MockerPrefill", "requests no nvidia.com/gpu"),
    "v1alpha1_vllm_agg_xpu_dra.yaml": ("VllmDecodeWorker", "DRA resources.claims"),
    "v1beta1_vllm_agg_xpu_dra.yaml": ("worker", "DRA resources.claims"),
    "v1beta1_mocker_disagg.yaml": ("prefill", "requests no nvidia.com/gpu"),
    "v1alpha1_trtllm_gpt_oss_disagg.yaml": ("", "no worker-like component"),
}


def test_every_fixture_is_listed_once():
    files = {p.name for p in REAL.glob("*.yaml")}
    assert files == set(RESOLVES) | set(REFUSED)
    assert {"v1alpha1", "v1beta1"} == {n.split("_")[0] for n in files}


@pytest.mark.parametrize("name", sorted(set(RESOLVES) | set(REFUSED)))
def test_every_real_manifest_parses(name):
    dgd = parse_dgd(load(name))
    assert dgd.components and dgd.api_version.startswith("nvidia.com/v1")
    assert dgd.form == ("services" if name.startswith("v1alpha1") else "components")


@pytest.mark.parametrize("name", sorted(RESOLVES))
def test_power_inputs_resolve(name):
    mode, roles = RESOLVES[name]
    cfg = resolve_power_config(parse_dgd(annotate(load(name))))
    assert cfg.mode == mode
    assert {r: (rp.component, rp.watts_per_replica) for r, rp in cfg.roles.items()} == roles


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_power_awareness_refused_with_one_message(name):
    component, part = REFUSED[name]
    with pytest.raises(PowerInputError) as info:
        resolve_power_config(parse_dgd(annotate(load(name))))
    assert info.value.component == component
    assert part in str(info.value) and "\n" not in str(info.value)
    if component:
        assert repr(component) in str(info.value)


def test_all_seen_component_types_and_none_are_read():
    seen = set()
    for name in list(RESOLVES) + list(REFUSED):
        seen |= {c.type for c in parse_dgd(load(name)).components}
    assert seen == {None, *ComponentType}  # frontend worker prefill decode planner epp default main, untyped


def test_v1alpha1_sub_component_type_is_read():
    dgd = parse_dgd(load("v1alpha1_vllm_disagg.yaml"))
    w = dgd.component("VllmPrefillWorker")
    assert (w.type, w.sub_type) == (ComponentType.WORKER, ComponentType.PREFILL)


def test_two_generic_workers_whose_names_say_nothing_are_refused():
    obj = annotate(load("v1beta1_vllm_disagg_multinode.yaml"))
    for item in obj["spec"]["components"]:
        item["name"] = {"decode": "engine-a", "prefill": "engine-b"}.get(item["name"], item["name"])
    with pytest.raises(PowerInputError) as info:
        resolve_power_config(parse_dgd(obj))
    assert "two worker components ('engine-a' and 'engine-b')" in str(info.value)


def test_legacy_resources_win_and_requests_fall_back():
    obj = annotate(load("v1alpha1_vllm_agg.yaml"))
    svc = obj["spec"]["services"]["VllmDecodeWorker"]
    svc["extraPodSpec"] = {"mainContainer": {"resources": {"limits": {"nvidia.com/gpu": "8"}}}}
    assert resolve_power_config(parse_dgd(obj)).roles[Role.WORKER].gpus_per_pod == 1  # legacy resources.gpu first
    del svc["resources"]
    assert resolve_power_config(parse_dgd(obj)).roles[Role.WORKER].gpus_per_pod == 8


def test_duplicate_keys_are_refused():
    text = (REAL / "v1beta1_vllm_agg.yaml").read_text().replace(
        "    replicas: 1\n    type: worker", "    replicas: 1\n    replicas: 4\n    type: worker")
    with pytest.raises(ManifestError, match=r"duplicate key 'replicas' \(first at line \d+\)"):
        dgd_documents(text)
    with pytest.raises(ManifestError, match="duplicate key 'a'"):
        load_document('{"a": 1, "a": 2}')  # JSON is YAML: same rule
    assert load_document("a: 1\nb: {a: 2}") == {"a": 1, "b": {"a": 2}}


def test_renaming_a_power_aware_component_is_a_violation():
    old = parse_dgd(annotate(load("v1beta1_vllm_disagg.yaml")))
    renamed = annotate(load("v1beta1_vllm_disagg.yaml"))
    renamed["spec"]["components"][1]["name"] = "Decode2"
    got = [(v.path, v.old, v.new) for v in validate_dgd_update(old, parse_dgd(renamed))]
    assert got == [("spec.components[name=VllmDecodeWorker]", "VllmDecodeWorker", None),
                   ("spec.components[name=Decode2]", None, "Decode2")]


def test_gpu_counts_compare_effective_values_and_report_absent():
    old = annotate(load("v1beta1_vllm_agg.yaml"))
    new = copy.deepcopy(old)
    del new["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]
    [v] = validate_dgd_update(parse_dgd(old), parse_dgd(new))
    assert (v.old, v.new) == (1, None) and v.line().endswith("1 -> <absent>")
    zero = copy.deepcopy(new)
    zero["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 0}
    assert validate_dgd_update(parse_dgd(new), parse_dgd(zero)) == []  # absent = 0


# --- GB200 / GB300 shapes (issue 18 item 7) ---------------------------------------------------

CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"


def with_compute_domain_claim(obj: dict[str, Any], gpus: str = "4") -> dict[str, Any]:
    """As Kimi K3's GB200 DGDs: nvidia.com/gpu on main, plus a DRA claim for an IMEX channel."""
    out = annotate(obj)
    for item in out["spec"]["components"]:
        if item["type"] != "worker":
            continue
        spec = item["podTemplate"]["spec"]
        spec["resourceClaims"] = [{"name": "compute-domain-channel", "resourceClaimTemplateName": "kimi-channel"}]
        main = spec["containers"][0]
        main["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "claims": [{"name": "compute-domain-channel"}]}
    return out


def test_a_compute_domain_channel_claim_leaves_the_gpu_count_readable():
    obj = parse_dgd(with_compute_domain_claim(load("v1beta1_vllm_disagg_multinode.yaml")))
    cfg = resolve_power_config(obj, {"kimi-channel": (CHANNEL_CLASS,)})
    assert {r: rp.watts_per_replica for r, rp in cfg.roles.items()} == {Role.PREFILL: 300 * 4 * 2, Role.DECODE: 300 * 4 * 2}
    # without the template looked up, the claim may allocate GPUs: refused, saying why
    with pytest.raises(PowerInputError, match="could not be looked up"):
        resolve_power_config(obj)
    # a claim whose device class is a GPU cannot be counted: refused
    with pytest.raises(PowerInputError, match="allocate GPUs and their count cannot be read"):
        resolve_power_config(obj, {"kimi-channel": ("gpu.nvidia.com",)})


def test_a_gpu_on_a_native_sidecar_init_container_counts():
    obj = annotate(load("v1beta1_vllm_agg.yaml"))
    worker = obj["spec"]["components"][1]
    spec = worker["podTemplate"]["spec"]
    main = spec["containers"][0]
    sidecar = {"name": "engine", "image": "e", "restartPolicy": "Always", "resources": main.pop("resources")}
    spec["initContainers"] = [sidecar]
    cfg = resolve_power_config(parse_dgd(obj))
    assert cfg.roles[Role.WORKER].gpus_per_pod == 1
    dgd = parse_dgd(obj)
    assert dgd.component(worker["name"]).gpu_path.endswith("initContainers[name=engine].resources.limits[nvidia.com/gpu]")
    # a plain init container runs before main and releases its GPU: the component has none
    del sidecar["restartPolicy"]
    with pytest.raises(PowerInputError, match="requests no nvidia.com/gpu"):
        resolve_power_config(parse_dgd(obj))
    # main and a native sidecar both holding GPUs: the pod holds both
    main["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    sidecar["restartPolicy"] = "Always"
    assert resolve_power_config(parse_dgd(obj)).roles[Role.WORKER].gpus_per_pod == 3
