"""The twin's kubelet PodResources API: ``v1.PodResourcesLister/List`` on a unix socket per node,
answered from the twin's allocations (each pod's GPU indexes, as its operator placed them).

What a real kubelet answers for pods with ``nvidia.com/gpu``: per pod, per container, the
device plugin's device IDs, which for NVIDIA GPUs are the GPU UUIDs, and for a MIG slice its MIG
UUID (served under ``mig_resource``: ``nvidia.com/gpu`` as the plugin's ``single`` MIG strategy
names it, or ``nvidia.com/mig-<profile>`` as ``mixed`` does); the agent reads it with
``powerfleet.agent.podresources.PodResourcesClient``. Sockets live in a short temporary
directory (a unix socket path must stay under ~107 bytes), one ``<node>.sock`` each; point an
agent at it with ``agent.podresources_socket: <dir>/{node}.sock``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from powerfleet.agent.podresources import api_pb2, api_pb2_grpc

PodSource = Callable[[], Sequence[Mapping[str, Any]]]


def list_response(node: str, pods: Sequence[Mapping[str, Any]], gpus_of: Callable[[Mapping[str, Any]], list[int]],
                  uuid_of: Callable[[int], str], mig_resource: str = "nvidia.com/gpu") -> api_pb2.ListPodResourcesResponse:
    out = api_pb2.ListPodResourcesResponse()
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        res = out.pod_resources.add(name=meta.get("name", ""), namespace=meta.get("namespace", ""))
        containers = spec.get("containers") or [{"name": "main"}]
        for i, c in enumerate(containers):
            cr = res.containers.add(name=c.get("name", ""))
            indexes = gpus_of(pod) if i == 0 else []  # the twin gives a pod's GPUs to its first container
            ids = [uuid_of(g) for g in indexes]
            gpus, migs = [d for d in ids if not d.startswith("MIG-")], [d for d in ids if d.startswith("MIG-")]
            for resource, device_ids in (("nvidia.com/gpu", gpus), (mig_resource, migs)):
                if device_ids:
                    cr.devices.add(resource_name=resource, device_ids=device_ids)
    return out


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, answer: Callable[[], api_pb2.ListPodResourcesResponse]) -> None:
        self.answer = answer

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:  # noqa: N802 - gRPC name
        return self.answer()


class PodResourcesServers:
    """One gRPC server per node, each on ``<dir>/<node>.sock``."""

    def __init__(self, nodes: Sequence[str], pods: PodSource, gpus_of: Callable[[Mapping[str, Any]], list[int]],
                 uuid_of: Callable[[str, int], str], mig_resource: str = "nvidia.com/gpu") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pfpr-"))
        self._servers: list[grpc.Server] = []
        self.sockets: dict[str, Path] = {}
        for node in nodes:
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(
                _Lister(lambda n=node: list_response(n, pods(), gpus_of, lambda g, n=n: uuid_of(n, g), mig_resource)),
                server)
            path = self.dir / f"{node}.sock"
            server.add_insecure_port(f"unix://{path}")
            self._servers.append(server)
            self.sockets[node] = path

    @property
    def pattern(self) -> str:
        """``agent.podresources_socket`` for agents of these nodes."""
        return str(self.dir / "{node}.sock")

    def start(self) -> "PodResourcesServers":
        for s in self._servers:
            s.start()
        return self

    def stop(self) -> None:
        for s in self._servers:
            s.stop(grace=None)
        shutil.rmtree(self.dir, ignore_errors=True)
