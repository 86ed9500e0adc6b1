"""The twin's reduced DGD schema against the upstream extract it is derived from (fixtures/crds)."""

from __future__ import annotations

from pathlib import Path

import yaml

from powerfleet.twin.apiserver.crds import crds
from powerfleet.twin.cluster.dgdstatus import CRD_STATUS_KEYS

CRDS = Path(__file__).parent / "fixtures" / "crds"


def _dgd():
    return crds()[("nvidia.com", "dynamographdeployments")]


def test_v1alpha1_status_is_the_published_block_plus_placement() -> None:
    published = yaml.safe_load((CRDS / "dgd_v1alpha1_status.29a131e8.yaml").read_text())
    twin = _dgd().schemas["v1alpha1"]["properties"]["status"]
    assert {k: v for k, v in twin["properties"].items() if k != "placement"} == published["properties"]
    assert twin["required"] == published["required"] == ["state"]
    assert set(twin["properties"]["placement"]["properties"]) == {"score", "state"}


def test_v1beta1_status_has_dynamos_property_names() -> None:
    status = _dgd().schemas["v1beta1"]["properties"]["status"]["properties"]
    assert set(status) == {"checkpoints", "components", "conditions", "observedGeneration", "placement",
                           "restart", "rollingUpdate", "state"}
    assert set(status["components"]["additionalProperties"]["properties"]) == {
        "availableReplicas", "componentKind", "componentNames", "gpusPerEngine", "gpusPerReplica",
        "readyReplicas", "replicas", "runtimeNamespace", "scheduledReplicas", "updatedReplicas"}
    assert set(status["rollingUpdate"]["properties"]) == {"endTime", "phase", "startTime", "updatedComponents"}
    # The operator's idea of "its" status keys is every status property of either version.
    alpha = _dgd().schemas["v1alpha1"]["properties"]["status"]["properties"]
    assert CRD_STATUS_KEYS == set(status) | set(alpha)


def test_no_preserve_unknown_fields_where_dynamo_has_none() -> None:
    def walk(node, path=""):
        if isinstance(node, dict):
            assert "x-kubernetes-preserve-unknown-fields" not in node, path
            for k, v in node.items():
                walk(v, f"{path}.{k}")
    for crd in crds().values():
        walk(dict(crd.schemas))
    assert _dgd().storage == "v1alpha1" and crds()[("nvidia.com", "dynamographdeploymentscalingadapters")].storage == "v1beta1"
