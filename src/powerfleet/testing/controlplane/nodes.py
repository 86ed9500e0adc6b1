"""Fake GPU nodes for kwok (its `kwok.x-k8s.io/node: fake` annotation selects them): allocatable
``nvidia.com/gpu``, the rack label the budget groups by, optional taints."""

from __future__ import annotations

from typing import Any

FAKE_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
RACK_LABEL = "powerfleet.io/rack"
GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


def gpu_node(name: str, *, rack: str, gpus: int = 8, taints: list[dict[str, str]] | None = None,
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": dict(FAKE_ANNOTATION),
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "type": "kwok", RACK_LABEL: rack,
                                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.present": "true",
                                **(labels or {})}},
        "spec": {"taints": list(taints or [])},
        "status": {"capacity": capacity, "allocatable": dict(capacity),
                   "nodeInfo": {"kubeletVersion": "fake", "kubeProxyVersion": "fake", "architecture": "amd64",
                                "operatingSystem": "linux", "containerRuntimeVersion": "", "kernelVersion": "",
                                "osImage": "", "bootID": "", "machineID": "", "systemUUID": ""}},
    }
