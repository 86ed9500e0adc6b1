"""Helpers of the control_plane tier: fake GPU nodes, ServiceAccount tokens, the chart rendered by
the real helm binary."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from powerfleet.testing.controlplane import GPU_TAINT, ControlPlane, gpu_node
from tests.waiting import wait_for

CHART = Path(__file__).resolve().parents[2] / "charts" / "powerfleet"
# name -> (rack, taints): two racks of two nodes; gpu-b-2 takes only pods tolerating the GPU taint.
NODES: dict[str, tuple[str, list[dict[str, str]]]] = {
    "gpu-a-1": ("rack-a", []), "gpu-a-2": ("rack-a", []),
    "gpu-b-1": ("rack-b", []), "gpu-b-2": ("rack-b", [GPU_TAINT]),
}
GPUS_PER_NODE = 8


def admin_client(plane: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(plane.kubeconfig))


def node_ready(node: client.V1Node) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


@dataclass
class FakeNodes:
    names: list[str]

    @classmethod
    def create(cls, plane: ControlPlane) -> FakeNodes:
        api = admin_client(plane)
        core = client.CoreV1Api(api)
        try:
            # What the NVIDIA GPU operator installs beside the nodes: the runtime class the agent's pods name.
            client.NodeV1Api(api).create_runtime_class(client.V1RuntimeClass(
                metadata=client.V1ObjectMeta(name="nvidia"), handler="nvidia"))
            for name, (rack, taints) in NODES.items():
                core.create_node(gpu_node(name, rack=rack, gpus=GPUS_PER_NODE, taints=taints))
            wait_for(lambda: all(node_ready(core.read_node(n)) for n in NODES), "kwok nodes Ready", timeout_s=60)
        finally:
            api.close()
        return cls(list(NODES))


def service_account_token(core: client.CoreV1Api, namespace: str, name: str, *,
                          bound_pod: client.V1Pod | None = None) -> str:
    """A TokenRequest token for the ServiceAccount; bound to a pod, it carries that pod's node-name claim."""
    ref = None
    if bound_pod is not None:
        ref = client.V1BoundObjectReference(kind="Pod", api_version="v1", name=bound_pod.metadata.name,
                                            uid=bound_pod.metadata.uid)
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=[], expiration_seconds=3600, bound_object_ref=ref))
    return core.create_namespaced_service_account_token(name, namespace, req).status.token


def client_for_token(plane: ControlPlane, tmp: Path, token: str, user: str, namespace: str) -> client.ApiClient:
    path = plane.token_kubeconfig(tmp / f"{user}.kubeconfig", token, user=user, namespace=namespace)
    return config.new_client_from_config(config_file=str(path))


def helm(plane: ControlPlane, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(plane.bin_dir / "helm"), f"--kubeconfig={plane.kubeconfig}", *args],
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def helm_template(plane: ControlPlane, release: str, namespace: str, values: dict[str, Any],
                  tmp: Path) -> list[dict[str, Any]]:
    vf = tmp / f"{release}-values.yaml"
    vf.write_text(yaml.safe_dump(values))
    done = helm(plane, "template", release, str(CHART), "-n", namespace, "-f", str(vf), "--kube-version", "1.37.2")
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]
