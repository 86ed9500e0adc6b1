"""Inputs for ``agent once`` read from files: a PodList as ``kubectl get pods -o json`` prints it,
and the kubelet's PodResources ``List`` answer as ``grpcurl`` prints it (protobuf JSON:
``{"podResources": [{"name", "namespace", "containers": [{"name", "devices": [{"resourceName",
"deviceIds"}]}]}]}``; the proto's own snake_case names are accepted too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from pydantic import ValidationError

from powerfleet.cluster.objects import PodInfo


def pod_from_object(obj: Any, where: str) -> PodInfo:
    if not isinstance(obj, Mapping):
        raise ValueError(f"{where}: expected a Pod object, got {type(obj).__name__}")
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not all(isinstance(x, Mapping) for x in (meta, spec, status)):
        raise ValueError(f"{where}: metadata, spec and status must be objects")
    if obj.get("kind", "Pod") != "Pod" or not meta.get("name"):
        raise ValueError(f"{where}: not a Pod (kind {obj.get('kind')!r}, metadata.name {meta.get('name')!r})")
    if not isinstance(meta.get("uid"), str) or not meta["uid"]:
        # The agent matches a GPU's processes to pods by uid (their cgroup path): a pod without
        # one would match nothing, and its GPU would read as released. kubectl always prints it.
        raise ValueError(f"{where}: metadata.uid: required (a pod from `kubectl get pods -o json` has one)")
    try:
        return PodInfo(
            name=meta.get("name", ""), namespace=meta.get("namespace") or "", uid=meta.get("uid") or "",
            node_name=spec.get("nodeName"), phase=status.get("phase"), labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {}, terminating=meta.get("deletionTimestamp") is not None,
            resource_version=str(meta.get("resourceVersion") or ""),
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{where}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def pods_from_podlist(data: Any, node: str, namespaces: Sequence[str] = ()) -> list[PodInfo]:
    """The pods of ``node`` (and of ``namespaces``, when given) in a PodList (or a bare list of pods)."""
    items = data.get("items") if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise ValueError("expected a PodList (an object with an 'items' list), as `kubectl get pods -o json` prints")
    pods = [pod_from_object(item, f"items[{i}]") for i, item in enumerate(items)]
    return [p for p in pods if p.node_name == node and (not namespaces or p.namespace in namespaces)]


def allocations_from_json(data: Any) -> dict[str, list[Any]]:
    """Device ID -> allocations from a PodResources ``List`` answer in protobuf JSON; ValueError
    in one line for anything else (unknown fields, wrong types)."""
    from powerfleet.agent.podresources import api_pb2, gpu_allocations

    if not isinstance(data, Mapping):
        raise ValueError("expected a PodResources List answer (an object with 'podResources'), "
                         f"got {type(data).__name__}")
    try:
        resp = json_format.ParseDict(data, api_pb2.ListPodResourcesResponse())
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__) from None
    return gpu_allocations(resp)
