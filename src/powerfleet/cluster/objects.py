"""Plain views of the Kubernetes objects powerfleet reads (independent of any client library)."""

from __future__ import annotations

from datetime import datetime

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from powerfleet.cluster.dgd import GPU_RESOURCE, INT_RE


class PodInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str = ""
    node_name: str | None = None
    phase: str | None = None  # Pending | Running | Succeeded | Failed | Unknown
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    terminating: bool = False  # metadata.deletionTimestamp is set
    resource_version: str = ""
    ready: bool = False  # the Ready condition is True
    # "<container>@<state.running.startedAt>" per running container: a start or restart changes it
    started_containers: tuple[str, ...] = ()

    @property
    def is_running_or_starting(self) -> bool:
        return self.phase not in ("Succeeded", "Failed")


class NodeInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    # status.allocatable["nvidia.com/gpu"] as the kubelet reports it; None: not reported (unknown)
    gpu_allocatable: int | None = None


def gpu_allocatable(allocatable: Mapping[str, Any]) -> int | None:
    """A node's allocatable ``nvidia.com/gpu`` (a plain count); None where it reports none or
    something that is not a count: its GPU capacity is unknown (the budget sets no ceiling)."""
    raw = allocatable.get(GPU_RESOURCE)
    text = str(raw).strip() if raw is not None else ""
    return int(text) if INT_RE.fullmatch(text) else None


class Lease(BaseModel):
    """coordination.k8s.io/v1 Lease. ``resource_version`` is required for update/delete checks."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    resource_version: str = ""
    uid: str = ""


class ObjectRef(BaseModel):
    """What an Event is about."""

    model_config = ConfigDict(frozen=True)

    kind: str
    name: str
    namespace: str
    api_version: str = ""
    uid: str = ""


class EventInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    involved: ObjectRef
    reason: str
    message: str
    type: str = "Normal"
    count: int = 1
