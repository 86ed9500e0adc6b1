"""GPU identity from the kubelet: which pod each GPU is allocated to (PodResources v1 ``List``).

The kubelet serves ``v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``), as dcgm-exporter and Dynamo's agent read
it: per pod, per container, the device IDs of each extended resource. For ``nvidia.com/gpu``
the NVIDIA device plugin's IDs are GPU UUIDs (``GPU-…``; ``GPU-…::N`` with time-slicing).
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
GPU_RESOURCES = ("nvidia.com/gpu",)


class PodResourcesUnavailable(Exception):
    """The socket is absent or the call failed; the agent maps by process only."""


@dataclass(frozen=True)
class Allocation:
    namespace: str
    pod: str
    container: str


def gpu_allocations(response: api_pb2.ListPodResourcesResponse) -> dict[str, Allocation]:
    """GPU UUID -> the container it is allocated to (the first one, if a UUID appears twice)."""
    out: dict[str, Allocation] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name not in GPU_RESOURCES:
                    continue
                for device_id in dev.device_ids:
                    uuid = device_id.split("::", 1)[0]
                    if uuid.startswith("GPU-"):
                        out.setdefault(uuid, Allocation(pod.namespace, pod.name, container.name))
    return out


class PodResourcesClient:
    def __init__(self, socket_path: str, timeout_s: float = TIMEOUT_S) -> None:
        self.socket_path, self.timeout_s = socket_path, timeout_s

    def available(self) -> bool:
        return os.path.exists(self.socket_path)

    def list(self) -> dict[str, Allocation]:
        if not self.available():
            raise PodResourcesUnavailable(f"{self.socket_path} does not exist")
        try:
            with grpc.insecure_channel(f"unix://{self.socket_path}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                return gpu_allocations(stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s))
        except grpc.RpcError as exc:
            raise PodResourcesUnavailable(f"{self.socket_path}: {exc.code().name}: {exc.details()}") from None
