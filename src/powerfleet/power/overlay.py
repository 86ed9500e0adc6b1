"""The guard's overlay to one node, and the rule an agent applies with it (pure).

The live guard (tasks/power.py; docs/power.md, "Live") sends one overlay per node
and period: the throttle caps of that node's GPUs in the group, and the safe cap of every
one of them. The safe caps travel with every overlay so that the fallback needs no one to
be reachable. ``Overlay`` is the message's model (the argument model of the
``powerfleet.agent.throttle`` task); ``by_node`` cuts a ``GuardDecision``
into overlays; ``agent_cap`` is what an agent enforces for one GPU:

* while the last overlay is fresh (decided less than ``period_s x (1 + grace)`` ago on the agent's
  own clock: ``received_at`` is its arrival less its age then, agent/throttle.py, so that a late
  message is trusted only for what is left and a guard clock ahead changes nothing):
  ``min(annotation cap, throttle cap)``, or the annotation cap where the GPU is not throttled;
* once it is not (guard, beat or Redis gone; a late message): the GPU's safe cap, never above
  the annotation cap, held until a fresh overlay arrives;
* a GPU no overlay ever named (its group is not oversubscribed): the annotation cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from powerfleet.config.fleet import is_node_name
from powerfleet.power.guard import GuardDecision

GRACE = 0.5  # of a period: an overlay this late is missed (one period at most, with the pass cadence)


class Overlay(BaseModel):
    """The guard's overlay to one node for one group and period (watts)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    node: str = Field(min_length=1, max_length=253)
    group: str = Field(min_length=1, max_length=253)
    caps: dict[str, float] = Field(default_factory=dict)  # GPU UUID -> throttle cap; absent: not throttled
    safe: dict[str, float] = Field(min_length=1)  # GPU UUID -> safe cap, for every GPU of the group on the node
    period_s: float = Field(gt=0, le=3600)
    revision: int = Field(ge=0)  # monotonic per group: an agent ignores an older one
    issued_at: float  # the guard's clock (for logs and metrics only)
    epoch: str = Field("", max_length=64)  # the guard memory's epoch (power/authority.py)

    @field_validator("node")
    @classmethod
    def _node(cls, v: str) -> str:
        if not is_node_name(v):
            raise ValueError(f"{v!r} is not a valid Kubernetes node name")
        return v

    @model_validator(mode="after")
    def _check(self) -> Overlay:
        for name, caps in (("caps", self.caps), ("safe", self.safe)):
            for gpu, w in caps.items():
                if not w > 0:
                    raise ValueError(f"{name}[{gpu!r}] must be a positive number of W, got {w}")
        extra = sorted(set(self.caps) - set(self.safe))
        if extra:
            raise ValueError(f"caps names GPUs without a safe cap: {', '.join(extra)}")
        return self

    def ttl_s(self) -> float:
        """How long the message may wait in the node's queue before it is useless (Celery ``expires``)."""
        return self.period_s * (1.0 + GRACE)


def by_node(decision: GuardDecision, node_of: Mapping[str, str], group: str, period_s: float, revision: int,
            issued_at: float, epoch: str = "") -> dict[str, Overlay]:
    """One overlay per node holding any of the decision's GPUs (``node_of``: GPU -> node; a GPU it
    does not name is left out)."""
    nodes: dict[str, dict[str, dict[str, float]]] = {}
    for gpu, safe in sorted(decision.safe.items()):
        if gpu not in node_of:
            continue  # counted, but no agent to tell (power/live.py's unseen GPUs)
        entry = nodes.setdefault(node_of[gpu], {"caps": {}, "safe": {}})
        entry["safe"][gpu] = safe
        if gpu in decision.throttle:
            entry["caps"][gpu] = decision.throttle[gpu]
    return {node: Overlay(node=node, group=group, caps=e["caps"], safe=e["safe"], period_s=period_s,
                          revision=revision, issued_at=issued_at, epoch=epoch) for node, e in sorted(nodes.items())}


@dataclass(frozen=True)
class AgentCap:
    cap_w: float
    why: str  # "annotation" | "throttle" | "fallback"


def agent_cap(gpu: str, annotation_w: float, overlay: Overlay | None, received_at: float | None,
              now: float) -> AgentCap:
    """The cap an agent enforces on ``gpu``; ``received_at`` and ``now`` on the agent's clock."""
    if overlay is None or gpu not in overlay.safe:
        return AgentCap(annotation_w, "annotation")
    fresh = received_at is not None and now - received_at <= overlay.period_s * (1.0 + GRACE)
    if not fresh:
        return AgentCap(min(annotation_w, overlay.safe[gpu]), "fallback")
    throttle = overlay.caps.get(gpu)
    if throttle is None or throttle >= annotation_w:
        return AgentCap(annotation_w, "annotation")
    return AgentCap(throttle, "throttle")
