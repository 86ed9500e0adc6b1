"""The custom resource definitions the loopback server serves with their structural schemas
(``crds/*.yaml``: Dynamo's DGD, reduced, and its scaling adapter; tests/cluster/fixtures/crds/)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from powerfleet.twin.apiserver.resources import ResourceType

_FILES = ("nvidia.com_dynamographdeployments.yaml", "nvidia.com_dynamographdeploymentscalingadapters.yaml")


@dataclass(frozen=True)
class Crd:
    group: str
    plural: str
    kind: str
    versions: tuple[str, ...]  # in the file's order
    storage: str
    schemas: Mapping[str, Mapping[str, Any]]  # version -> openAPIV3Schema
    subresources: Mapping[str, Mapping[str, Any]]  # version -> subresources


@cache
def crds() -> dict[tuple[str, str], Crd]:
    out: dict[tuple[str, str], Crd] = {}
    for name in _FILES:
        doc = yaml.safe_load(resources.files("powerfleet.twin.apiserver").joinpath("crds", name).read_text())
        spec = doc["spec"]
        versions = [v for v in spec["versions"] if v.get("served")]
        crd = Crd(
            group=spec["group"], plural=spec["names"]["plural"], kind=spec["names"]["kind"],
            versions=tuple(v["name"] for v in versions),
            storage=next(v["name"] for v in spec["versions"] if v.get("storage")),
            schemas={v["name"]: v["schema"]["openAPIV3Schema"] for v in versions},
            subresources={v["name"]: v.get("subresources") or {} for v in versions},
        )
        out[(crd.group, crd.plural)] = crd
    return out


def crd_of(rt: ResourceType) -> Crd | None:
    return crds().get(rt.key)
