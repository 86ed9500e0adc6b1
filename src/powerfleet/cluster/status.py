"""The status subset of a DGD that powerfleet reads, leniently: controllers write it, and an
unreadable value counts as unknown (docs/cluster.md, "Status subset").

Only fields that exist in Dynamo's CRD are read (tests/cluster/fixtures/crds/SOURCE.md):

* ``observedGeneration``, ``state`` (``initializing|pending|successful|failed``);
* ``rollingUpdate.phase`` (``Pending|InProgress|Completed|Failed|""``) and the list of components
  that finished it, ``rollingUpdate.updatedServices`` (v1alpha1) / ``updatedComponents`` (v1beta1);
* per component, ``services.<name>`` (v1alpha1) / ``components.<name>`` (v1beta1), both maps:
  ``replicas``, ``readyReplicas``, ``updatedReplicas``, ``availableReplicas``;
* the ``Ready`` condition's message (the only prose the operator writes about a failure).

Dynamo has no per-component rollout phase. ``ComponentStatus.rollout`` is derived from the
deployment's rolling update: a component listed as updated is ``Completed``, any other takes the
deployment's phase while one is in progress; with no rolling update (or no list) it is unknown.
"""

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
    available_replicas: int | None = None
    rollout: RolloutPhase | None = None  # derived from status.rollingUpdate (see the module docstring)
    message: str = ""  # the Ready condition's message when this component's rollout failed


class DGDStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    observed_generation: int | None = None
    state: str | None = None
    rollout: RolloutPhase | None = None  # status.rollingUpdate.phase (deployment-wide)
    rollout_message: str = ""  # the Ready condition's message
    updated_components: tuple[str, ...] | None = None  # rollingUpdate.updated{Services,Components}
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


def _ready_message(raw: Mapping[str, Any]) -> str:
    conditions = raw.get("conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready" and isinstance(cond.get("message"), str):
            return str(cond["message"])
    return ""


def _updated(rolling: Mapping[str, Any]) -> tuple[str, ...] | None:
    raw = rolling.get("updatedComponents", rolling.get("updatedServices"))
    if not isinstance(raw, list):
        return None
    return tuple(str(v) for v in raw if isinstance(v, str))


def _component_rollout(name: str, phase: RolloutPhase | None, updated: tuple[str, ...] | None) -> RolloutPhase | None:
    if phase is None or updated is None:
        return None
    if name in updated:
        return RolloutPhase.COMPLETED
    return phase


def parse_status(raw: Any) -> DGDStatus:
    """Lenient: the status is written by controllers; anything unreadable counts as unknown."""
    if not isinstance(raw, Mapping):
        return DGDStatus()
    rolling = raw.get("rollingUpdate") if isinstance(raw.get("rollingUpdate"), Mapping) else {}
    phase = _phase(rolling.get("phase"))
    updated = _updated(rolling)
    message = _ready_message(raw)
    comps_raw = raw.get("components", raw.get("services"))
    comps: dict[str, ComponentStatus] = {}
    for cname, v in comps_raw.items() if isinstance(comps_raw, Mapping) else []:
        if not isinstance(v, Mapping):
            continue
        rollout = _component_rollout(str(cname), phase, updated)
        comps[str(cname)] = ComponentStatus(
            replicas=opt_int(v.get("replicas")),
            # Grove's PodCliqueScalingGroup (multinode) reports availableReplicas, not readyReplicas.
            ready_replicas=opt_int(v.get("readyReplicas", v.get("availableReplicas"))),
            updated_replicas=opt_int(v.get("updatedReplicas")),
            available_replicas=opt_int(v.get("availableReplicas")),
            rollout=rollout,
            message=message if rollout is RolloutPhase.FAILED else "",
        )
    return DGDStatus(
        observed_generation=opt_int(raw.get("observedGeneration")),
        state=raw.get("state") if isinstance(raw.get("state"), str) else None,
        rollout=phase,
        rollout_message=message,
        updated_components=updated,
        components=comps,
    )
