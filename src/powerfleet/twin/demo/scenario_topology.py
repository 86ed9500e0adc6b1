"""A scenario's cluster (docs/twin.md "Scenario files"): racks with their limits, node groups with
their GPUs, card model, labels and taints, and the tolerations a pod may carry; the strict base of
every scenario model (unknown keys refused, nothing coerced, frozen). twin/demo/scenario_model.py
holds the rest of the format and re-exports these.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

from powerfleet.agent.catalog import product_range_w
from powerfleet.twin.cluster.topology import GPU_MAX_W, GPU_MIN_W, GPU_PRODUCT, MAX_NODES

NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # a DNS label, as Kubernetes names racks' label values and pods
Name = Annotated[str, Field(pattern=NAME)]
Watts = Annotated[StrictInt, Field(ge=1, le=10_000_000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Taint(_Strict):
    """A node taint, as Kubernetes writes it: pods that do not tolerate a ``NoSchedule`` or
    ``NoExecute`` taint are not scheduled there (``PreferNoSchedule`` only scores)."""

    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")]
    value: Annotated[str, Field(max_length=63)] = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Toleration(_Strict):
    """A pod's toleration (Kubernetes' fields): ``Exists`` matches any value; no key with ``Exists``
    tolerates every taint; no effect matches every effect."""

    key: Annotated[str, Field(max_length=253)] = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: Annotated[str, Field(max_length=63)] = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def as_k8s(self) -> dict[str, str]:
        out = {"key": self.key, "operator": self.operator, "value": self.value, "effect": self.effect or ""}
        return {k: v for k, v in out.items() if v}


class NodeGroup(_Strict):
    """``count`` identical nodes; named ``twin-gpu-NN`` in file order across racks."""

    count: Annotated[StrictInt, Field(ge=1, le=MAX_NODES)] = 1
    gpus: Annotated[StrictInt, Field(ge=1, le=16)] = 8
    model: str = GPU_PRODUCT
    labels: dict[Annotated[str, Field(max_length=253)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=32)
    taints: list[Taint] = Field(default_factory=list, max_length=16,
                                description="the nodes' taints; the twin's scheduler keeps untolerating pods off")

    @field_validator("model")
    @classmethod
    def _h100(cls, v: str) -> str:
        rng = product_range_w(v)
        if rng is None:
            raise ValueError(f"{v!r} is not in the agent's catalog (powerfleet.agent.catalog)")
        if rng != (GPU_MIN_W, GPU_MAX_W):
            raise ValueError(f"{v!r} ({rng[0]}-{rng[1]} W): the twin simulates only cards of "
                             f"{GPU_MIN_W}-{GPU_MAX_W} W (H100 SXM, H200)")
        return v

    @field_validator("labels")
    @classmethod
    def _no_reserved(cls, v: dict[str, str]) -> dict[str, str]:
        from powerfleet.twin.cluster.topology import RACK_LABEL

        if RACK_LABEL in v:
            raise ValueError(f"{RACK_LABEL} is set from the rack the node is listed under")
        return v


class Rack(_Strict):
    limit_w: Watts | None = Field(None, description="the rack's power limit; null: 80 % of its GPUs' maximum "
                                                    "plus what the ledger charges its tenants")
    oversubscription: Annotated[Union[StrictFloat, StrictInt], Field(ge=1, le=4)] = 1.0
    nodes: list[NodeGroup] = Field(min_length=1, max_length=MAX_NODES)


class Topology(_Strict):
    racks: dict[Name, Rack] = Field(min_length=1, max_length=16)
    namespace: Name = "default"

    @model_validator(mode="after")
    def _bounded(self) -> "Topology":
        n = sum(g.count for r in self.racks.values() for g in r.nodes)
        if n > MAX_NODES:
            raise ValueError(f"{n} nodes in all; the twin runs at most {MAX_NODES}")
        return self
