"""GPU identity from the kubelet: which pod each GPU is allocated to (PodResources v1 ``List``).

The kubelet serves ``v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``), as dcgm-exporter and Dynamo's agent read
it: per pod, per container, the device IDs of each extended resource. For ``nvidia.com/gpu``
the NVIDIA device plugin's IDs are GPU UUIDs (``GPU-…``; ``GPU-…::N`` with time-slicing, where
several pods share one GPU). A MIG slice is listed by its MIG UUID (``MIG-…``), under
``nvidia.com/gpu`` (the plugin's ``single`` strategy) or ``nvidia.com/mig-<profile>``
(``mixed``); its power limit is the parent GPU's, so the agent maps it to the parent through
NVML (``GpuReading.mig_uuids``) and several pods on slices of one parent share its cap.
The agent maps an idle GPU allocated to an annotated pod to that pod (capped before its first
kernel), covers MPS and graphics workloads whose processes NVML does not attribute, and
cross-checks the process mapping against it. ``api_pb2*.py`` are generated from ``api.proto``
(see there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from powerfleet.agent.podresources import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
TIMEOUT_S = 5.0
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


class PodResourcesUnavailable(Exception):
    """The socket is absent or the call failed; the agent maps by process only."""


@dataclass(frozen=True)
class Allocation:
    namespace: str
    pod: str
    container: str


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def gpu_allocations(response: api_pb2.ListPodResourcesResponse) -> dict[str, list[Allocation]]:
    """Device ID (GPU or MIG UUID, or an NVML index with ``deviceIDStrategy=index``, time-slicing's
    ``::N`` replica suffix dropped) -> the containers it is allocated to (several under
    time-slicing), in the kubelet's order, each once."""
    out: dict[str, list[Allocation]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if not is_gpu_resource(dev.resource_name):
                    continue
                for device_id in dev.device_ids:
                    uuid = device_id.split("::", 1)[0]
                    if uuid:  # a UUID, or an index (deviceIDStrategy=index): agent/ownership.py maps it
                        owners = out.setdefault(uuid, [])
                        alloc = Allocation(pod.namespace, pod.name, container.name)
                        if alloc not in owners:
                            owners.append(alloc)
    return out


class PodResourcesClient:
    def __init__(self, socket_path: str, timeout_s: float = TIMEOUT_S) -> None:
        self.socket_path, self.timeout_s = socket_path, timeout_s

    def available(self) -> bool:
        return os.path.exists(self.socket_path)

    def list(self) -> dict[str, list[Allocation]]:
        if not self.available():
            raise PodResourcesUnavailable(f"{self.socket_path} does not exist")
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                return gpu_allocations(stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s))
        except grpc.RpcError as exc:
            raise PodResourcesUnavailable(f"{self.socket_path}: {exc.code().name}: {exc.details()}") from None
