"""The kubelet's part of the twin, pure: a pod's next status step and when a terminating pod is gone.

A scheduled ``Pending`` pod starts (``Running``, ``Ready=False``, ``status.startTime`` = now,
each container ``running`` since then in ``containerStatuses``); it turns ``Ready`` (and its
containers ``ready``) once its component's startup delay has passed since ``startTime`` (a delay
of 0: at the next pass). The node agent's watch asks for a pass on both steps of an annotated
pod (a container start and the Ready flip, agent/watcher.py). A pod with ``metadata.deletionTimestamp`` is Terminating: it keeps its phase,
its GPUs and its processes, gets no status step, and is removed once its deadline (the
timestamp the API server set: deletion time + grace period) has passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(raw: Any) -> float | None:
    """RFC 3339 as the server writes it (``...Z``) or as the client re-serialises it (``+00:00``)."""
    if not isinstance(raw, str):
        return None
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def is_ready(pod: Mapping[str, Any]) -> bool:
    for cond in _map(pod.get("status")).get("conditions") or []:
        if _map(cond).get("type") == "Ready":
            return _map(cond).get("status") == "True"
    return False


def phase(pod: Mapping[str, Any]) -> str:
    return str(_map(pod.get("status")).get("phase") or "Pending")


def terminating(pod: Mapping[str, Any]) -> bool:
    return bool(_map(pod.get("metadata")).get("deletionTimestamp"))


def serving(pod: Mapping[str, Any]) -> bool:
    """Ready and not terminating: what an endpoint (and a load balancer) would send traffic to."""
    return is_ready(pod) and not terminating(pod)


def expired(pod: Mapping[str, Any], now: float) -> bool:
    """A terminating pod whose grace period is over (its processes are gone; remove it)."""
    deadline = parse_time(_map(pod.get("metadata")).get("deletionTimestamp"))
    return deadline is not None and deadline <= now


def container_statuses(pod: Mapping[str, Any], started: str, ready: bool) -> list[Obj]:
    """Every container running since ``started``, as a kubelet reports it (each field the API
    requires)."""
    return [{"name": str(_map(c).get("name") or ""), "image": str(_map(c).get("image") or ""), "imageID": "",
             "ready": ready, "started": True, "restartCount": 0, "state": {"running": {"startedAt": started}}}
            for c in _map(pod.get("spec")).get("containers") or []]


def next_status(pod: Mapping[str, Any], now: float, startup_delay_s: float) -> Obj | None:
    """The kubelet's step for a pod on a node; None when there is nothing to change."""
    if not _map(pod.get("spec")).get("nodeName") or terminating(pod):
        return None
    scheduled = {"type": "PodScheduled", "status": "True"}
    if phase(pod) == "Pending":
        return {"phase": "Running", "startTime": rfc3339(now),
                "conditions": [scheduled, {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
                "containerStatuses": container_statuses(pod, rfc3339(now), ready=False)}
    if phase(pod) == "Running" and not is_ready(pod):
        started = parse_time(_map(pod.get("status")).get("startTime"))
        if startup_delay_s > 0 and started is not None and now - started < startup_delay_s:
            return None
        out: Obj = {"phase": "Running", "conditions": [scheduled, {"type": "Ready", "status": "True"}]}
        if started is not None:
            out["startTime"] = _map(pod.get("status"))["startTime"]
        out["containerStatuses"] = container_statuses(pod, str(out.get("startTime") or rfc3339(now)), ready=True)
        return out
    return None
