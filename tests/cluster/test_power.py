from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerfleet.cluster.dgd import POWER_ANNOTATION, parse_dgd
from powerfleet.cluster.errors import DGDFormatError, DGDInputError, PowerInputError
from powerfleet.cluster.power import Role, parse_power_annotation, resolve_power_config, watts_per_replica
from tests.cluster.builders import component, dgd_obj, disagg


@given(st.one_of(st.text(), st.none(), st.integers(), st.floats(), st.binary()))
def test_annotation_parser_never_crashes(raw):
    try:
        cap = parse_power_annotation(raw)
    except PowerInputError as exc:
        assert exc.path == POWER_ANNOTATION
        return
    assert cap.raw == raw
    assert 0 < cap.watts <= 100_000
    assert raw.strip(" \t\r\n\f\v").isascii()


@given(st.integers(min_value=1, max_value=100_000), st.sampled_from(["", " ", "  ", "\t", "\n"]), st.sampled_from(["", " ", "\t"]))
def test_positive_integers_with_surrounding_whitespace_parse_and_keep_raw(watts, left, right):
    raw = f"{left}{watts}{right}"
    cap = parse_power_annotation(raw)
    assert cap.watts == watts and cap.raw == raw


@pytest.mark.parametrize(
    ("raw", "watts", "message"),
    [
        (" 350 ", 350, None),
        ("350", 350, None),
        ("0", None, "must be a positive number of watts"),
        ("-5", None, "is not a positive integer number of watts"),
        ("3.5e2", None, "is not a positive integer number of watts"),
        ("abc", None, "is not a positive integer number of watts"),
        ("", None, "is empty"),
        ("+350", None, "is not a positive integer number of watts"),
        ("3_50", None, "is not a positive integer number of watts"),
        ("٣٥٠", None, "is not a positive integer number of watts"),  # Arabic-Indic digits
        ("350W", None, "is not a positive integer number of watts"),
        ("999999", None, "exceeds"),
    ],
)
def test_documented_outcomes(raw, watts, message):
    if watts is not None:
        cap = parse_power_annotation(raw)
        assert (cap.watts, cap.raw) == (watts, raw)
    else:
        with pytest.raises(PowerInputError, match=message.replace("+", r"\+")):
            parse_power_annotation(raw, path="p", component="decode")


def test_error_names_component_and_exact_path():
    dgd = parse_dgd(disagg(decode_cap="3.5e2"))
    with pytest.raises(PowerInputError) as info:
        resolve_power_config(dgd)
    err = info.value
    assert err.component == "decode"
    assert err.path == "spec.components[name=decode].podTemplate.metadata.annotations[dynamo.nvidia.com/gpu-power-limit]"
    assert str(err) == f"{err.path}: '3.5e2' is not a positive integer number of watts"


def test_watts_per_replica_disagg():
    cfg = resolve_power_config(parse_dgd(disagg()))
    assert cfg.mode == "disagg"
    assert cfg.roles[Role.PREFILL].watts_per_replica == 350 * 2 * 1
    assert cfg.roles[Role.DECODE].watts_per_replica == 300 * 4 * 2  # requests fallback, nodeCount 2
    assert watts_per_replica(350, 2) == 700 and watts_per_replica(300, 4) == 1200


def test_agg_uses_generic_worker():
    cfg = resolve_power_config(parse_dgd(dgd_obj(component("fe", "frontend", gpus=None), component("w", "worker", cap="400", gpus=8))))
    assert cfg.mode == "agg"
    assert cfg.roles == {Role.WORKER: cfg.roles[Role.WORKER]}
    assert cfg.roles[Role.WORKER].component == "w" and cfg.roles[Role.WORKER].watts_per_replica == 3200
    assert cfg.for_component("w") is cfg.roles[Role.WORKER] and cfg.for_component("fe") is None


@pytest.mark.parametrize(
    ("obj", "error", "component", "path_suffix"),
    [
        (disagg(decode_cap=None), PowerInputError, "decode", "annotations[dynamo.nvidia.com/gpu-power-limit]"),
        (disagg(prefill_cap="abc"), PowerInputError, "prefill", "annotations[dynamo.nvidia.com/gpu-power-limit]"),
        (dgd_obj(component("p", "prefill", cap="1", gpus=0), component("d", "decode", cap="1")), PowerInputError, "p",
         "containers[name=main].resources.limits[nvidia.com/gpu]"),
        (dgd_obj(component("p", "prefill", cap="1", gpus=None), component("d", "decode", cap="1")), PowerInputError, "p",
         "containers[name=main].resources.limits[nvidia.com/gpu]"),
        (dgd_obj(component("p", "prefill", cap="1", gpus="0", via="requests"), component("d", "decode", cap="1")),
         PowerInputError, "p", "containers[name=main].resources.requests[nvidia.com/gpu]"),
        (dgd_obj(component("p", "prefill", cap="1", node_count=0), component("d", "decode", cap="1")), PowerInputError, "p",
         "multinode.nodeCount"),
        (dgd_obj(component("x", "embedder", cap="1")), DGDFormatError, "x", "spec.components[name=x].type"),
        (dgd_obj(component("fe", "frontend", cap="1")), PowerInputError, "", "spec.components"),
        (dgd_obj(component("p", "prefill", cap="1"), component("d", "decode", cap="1"), component("w", "worker", cap="1")),
         PowerInputError, "w", "spec.components[name=w].type"),
        (dgd_obj(component("a", "worker", cap="1"), component("b", "worker", cap="1")), PowerInputError, "a",
         "spec.components[name=a].type"),
        (dgd_obj(component("p1", "prefill", cap="1"), component("p2", "prefill", cap="1")), PowerInputError, "p2",
         "spec.components[name=p2].type"),
        (dgd_obj(component("fe", "frontend")), PowerInputError, "", "spec.components"),
        (dgd_obj(component("p", "prefill", cap="1", gpus="1.5"), component("d", "decode", cap="1")), DGDFormatError, "p",
         "limits[nvidia.com/gpu]"),
    ],
)
def test_bad_input_is_one_typed_error_naming_component_and_path(obj, error, component, path_suffix):
    with pytest.raises(error) as info:
        resolve_power_config(parse_dgd(obj))
    assert isinstance(info.value, DGDInputError)
    assert info.value.component == component
    assert info.value.path.endswith(path_suffix), info.value.path
