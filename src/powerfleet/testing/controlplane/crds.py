"""Dynamo's DGD and scaling-adapter CRDs as the real API server takes them.

The repository ships the loopback server's reduced schemas (src/powerfleet/twin/apiserver/crds,
tests/cluster/fixtures/crds/SOURCE.md). Two of their markers are the twin's own and mean, for a
real server, ``x-kubernetes-preserve-unknown-fields: true`` (kept as written, not pruned):
``x-twin-elided`` (a large subtree such as a PodSpec) and ``x-twin-unlisted`` (a level that lists
only the properties the fleet uses). Dynamo converts between the DGD's versions with a webhook that
cannot run here, so each CRD serves its storage version only (v1alpha1 for the DGD, v1beta1 for the
adapter); the fleet's adapter then reads and writes that version (``KubeCluster.dgd_version``).
"""

from __future__ import annotations

import copy
import time
from importlib import resources
from typing import Any

import yaml
from kubernetes import client

TWIN_MARKERS = ("x-twin-elided", "x-twin-unlisted")
FILES = ("nvidia.com_dynamographdeployments.yaml", "nvidia.com_dynamographdeploymentscalingadapters.yaml")


def _real_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_real_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _real_schema(v) for k, v in node.items() if k not in TWIN_MARKERS}
    if any(m in node for m in TWIN_MARKERS):
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def real_server_crd(text: str) -> dict[str, Any]:
    crd = copy.deepcopy(yaml.safe_load(text))
    crd["spec"]["versions"] = [_real_schema(v) for v in crd["spec"]["versions"] if v.get("storage")]
    crd["spec"].pop("conversion", None)
    return crd


def real_server_crds() -> list[dict[str, Any]]:
    base = resources.files("powerfleet.twin.apiserver") / "crds"
    return [real_server_crd((base / name).read_text()) for name in FILES]


def install_crds(api: client.ApiClient, timeout_s: float = 30.0) -> None:
    """Create both CRDs and wait until the server says each is Established."""
    ext = client.ApiextensionsV1Api(api)
    crds = real_server_crds()
    for crd in crds:
        ext.create_custom_resource_definition(crd)
    deadline = time.monotonic() + timeout_s
    for crd in crds:
        name = crd["metadata"]["name"]
        while not any(c.type == "Established" and c.status == "True"
                      for c in ext.read_custom_resource_definition(name).status.conditions or []):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout_s:.0f} s")
            time.sleep(0.1)
