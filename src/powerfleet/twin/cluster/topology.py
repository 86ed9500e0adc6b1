"""The twin's cluster shape: GPU nodes, their racks, and the Node objects seeded into the API server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RACK_LABEL = "powerfleet.io/rack"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
TWIN_LABEL = "powerfleet.io/twin"
MIN_NODES, MAX_NODES = 1, 64

# H100 SXM figures (../shared/research/power_sim.md section 2): limits 200..700 W, default 700 W.
GPU_MIN_W, GPU_MAX_W, GPU_DEFAULT_W = 200, 700, 700
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


@dataclass(frozen=True)
class NodeLayout:
    """One node of a scenario's topology (twin/demo/scenario_model.py): its rack, GPUs, card and labels."""

    rack: str
    gpus: int = 8
    model: str = GPU_PRODUCT
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect): the Node's spec.taints


@dataclass(frozen=True)
class TwinSpec:
    """How big the twin is. ``nodes`` 1..64; the first half of the nodes is rack-a, the rest rack-b,
    unless ``layout`` gives each node's rack, GPUs, card and labels (then ``nodes`` is its length)."""

    nodes: int = 4
    gpus_per_node: int = 8
    seed: int = 0
    namespace: str = "default"
    rack_a_nodes: int | None = None  # nodes in rack-a (None: the first half, rounded up)
    layout: tuple[NodeLayout, ...] = ()

    @classmethod
    def of_layout(cls, layout: tuple[NodeLayout, ...], *, seed: int = 0, namespace: str = "default") -> TwinSpec:
        return cls(nodes=len(layout), gpus_per_node=max(n.gpus for n in layout), seed=seed, namespace=namespace,
                   layout=layout)

    def __post_init__(self) -> None:
        if self.layout and len(self.layout) != self.nodes:
            raise ValueError(f"nodes ({self.nodes}) must be the layout's length ({len(self.layout)})")
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be between {MIN_NODES} and {MAX_NODES}, got {self.nodes}")
        if self.rack_a_nodes is not None and not 1 <= self.rack_a_nodes <= self.nodes:
            raise ValueError(f"rack_a_nodes must be between 1 and {self.nodes}, got {self.rack_a_nodes}")
        if not 1 <= self.gpus_per_node <= 16:
            raise ValueError(f"gpus_per_node must be between 1 and 16, got {self.gpus_per_node}")

    @property
    def node_names(self) -> list[str]:
        return [node_name(i) for i in range(self.nodes)]

    def rack_of(self, node: str) -> str:
        index = self.node_names.index(node)
        if self.layout:
            return self.layout[index].rack
        # ceil(n/2) nodes in rack-a, so one node is a one-rack cluster.
        split = self.rack_a_nodes if self.rack_a_nodes is not None else (self.nodes + 1) // 2
        return "rack-a" if index < split else "rack-b"

    @property
    def racks(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.node_names:
            out.setdefault(self.rack_of(n), []).append(n)
        return out

    def gpus_of(self, node: str) -> int:
        return self.layout[self.node_names.index(node)].gpus if self.layout else self.gpus_per_node

    def rack_gpus(self, rack: str) -> int:
        return sum(self.gpus_of(n) for n in self.racks.get(rack, []))

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_of(n) for n in self.node_names)


def node_name(index: int) -> str:
    return f"twin-gpu-{index:02d}"


def gpu_uuid(node: str, index: int, seed: int = 0) -> str:
    """A stable, UUID-shaped GPU id (``GPU-`` prefix as NVML prints it) for one twin GPU."""
    import hashlib

    h = hashlib.sha256(f"{seed}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def node_object(spec: TwinSpec, name: str) -> dict[str, Any]:
    gpus = str(spec.gpus_of(name))
    layout = spec.layout[spec.node_names.index(name)] if spec.layout else NodeLayout(spec.rack_of(name))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                **dict(layout.labels),
                "kubernetes.io/hostname": name,
                RACK_LABEL: spec.rack_of(name),
                GPU_PRODUCT_LABEL: layout.model,
                GPU_COUNT_LABEL: gpus,
                TWIN_LABEL: "true",
            },
        },
        "spec": {"taints": [{"key": k, "value": v, "effect": e} if v else {"key": k, "effect": e}
                            for k, v, e in layout.taints]} if layout.taints else {},
        "status": {
            "capacity": {"nvidia.com/gpu": gpus, "cpu": "128", "memory": "2Ti"},
            "allocatable": {"nvidia.com/gpu": gpus, "cpu": "126", "memory": "1984Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def node_objects(spec: TwinSpec) -> list[dict[str, Any]]:
    return [node_object(spec, n) for n in spec.node_names]
