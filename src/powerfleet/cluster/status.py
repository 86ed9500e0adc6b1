"""The status subset of a DGD that powerfleet reads, leniently: controllers write it, and an
unreadable value counts as unknown (docs/cluster.md, "Status subset")."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

INT_RE = re.compile(r"[0-9]{1,9}")


class RolloutPhase(StrEnum):
    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"


class ComponentStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    replicas: int | None = None
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    rollout: RolloutPhase | None = None
    message: str = ""


class DGDStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    observed_generation: int | None = None
    state: str | None = None
    rollout: RolloutPhase | None = None  # status.rollingUpdate.phase (deployment-wide)
    rollout_message: str = ""
    components: dict[str, ComponentStatus] = {}


def opt_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and INT_RE.fullmatch(value):
        return int(value)
    return None


def _phase(value: Any) -> RolloutPhase | None:
    try:
        return RolloutPhase(value)
    except ValueError:
        return None


def parse_status(raw: Any) -> DGDStatus:
    """Lenient: the status is written by controllers; anything unreadable counts as unknown."""
    if not isinstance(raw, Mapping):
        return DGDStatus()
    rolling = raw.get("rollingUpdate") if isinstance(raw.get("rollingUpdate"), Mapping) else {}
    comps_raw = raw.get("components", raw.get("services"))
    comps: dict[str, ComponentStatus] = {}
    entries: list[tuple[str, Any]] = []
    if isinstance(comps_raw, Mapping):
        entries = [(str(k), v) for k, v in comps_raw.items()]
    elif isinstance(comps_raw, list):
        entries = [(str(v.get("name")), v) for v in comps_raw if isinstance(v, Mapping) and v.get("name")]
    for cname, v in entries:
        if not isinstance(v, Mapping):
            continue
        rollout = v.get("rollout")
        phase = _phase(rollout.get("phase")) if isinstance(rollout, Mapping) else _phase(v.get("rolloutPhase"))
        message = rollout.get("message", "") if isinstance(rollout, Mapping) else ""
        comps[cname] = ComponentStatus(
            replicas=opt_int(v.get("replicas")),
            # Grove's PodCliqueScalingGroup (multinode) reports availableReplicas, not readyReplicas.
            ready_replicas=opt_int(v.get("readyReplicas", v.get("availableReplicas"))),
            updated_replicas=opt_int(v.get("updatedReplicas")),
            rollout=phase,
            message=str(message or ""),
        )
    return DGDStatus(
        observed_generation=opt_int(raw.get("observedGeneration")),
        state=raw.get("state") if isinstance(raw.get("state"), str) else None,
        rollout=_phase(rolling.get("phase")),
        rollout_message=str(rolling.get("message") or ""),
        components=comps,
    )
