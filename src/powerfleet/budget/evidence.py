"""Enforcement evidence: what the ledger charges a GPU that no listed deployment's cap covers
(issue 18 items 2 and 8), behind a port so the node agents' reports can be used when present.

The agents (the agent issue) will publish one Redis hash per node, ``powerfleet:enforcement:<node>``,
with a TTL of three reconcile intervals: field = GPU UUID, value = JSON
``{"pod_uid": str, "enforced_w": int, "draw_w": float, "at": epoch seconds}``, where ``enforced_w``
is a power-limit read back from that GPU after a successful write and ``draw_w`` the measured draw.
A report is fresh while ``now - at <= 3 x interval``. Until they exist the reader finds none and
every figure says which basis it uses (``requested_cap`` for an annotated pod, ``max_settable``
for a GPU without evidence).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

ENFORCEMENT_KEY = "powerfleet:enforcement:{node}"


@dataclass(frozen=True)
class GpuReport:
    gpu_uuid: str
    pod_uid: str
    enforced_w: int
    draw_w: float
    at: float


class EnforcementReports(Protocol):
    def reports(self, nodes: Iterable[str]) -> dict[str, list[GpuReport]]:
        """node -> its GPUs' reports (missing node: none)."""


class NoReports:
    """No agent publishes reports yet: every GPU without a cap is charged its maximum settable limit."""

    def reports(self, nodes: Iterable[str]) -> dict[str, list[GpuReport]]:
        return {}


def parse_report(gpu_uuid: str, raw: str | bytes) -> GpuReport | None:
    """One hash field's value; anything malformed is no evidence (None), never an error."""
    try:
        data = json.loads(raw)
        enforced, draw, at = data["enforced_w"], float(data.get("draw_w") or 0.0), float(data["at"])
        pod = data["pod_uid"]
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None
    if isinstance(enforced, float) and enforced.is_integer():  # the agent writes NVML's mW / 1000
        enforced = int(enforced)
    if not isinstance(enforced, int) or isinstance(enforced, bool) or enforced <= 0 or not isinstance(pod, str):
        return None
    if not (math.isfinite(draw) and math.isfinite(at)):
        return None
    return GpuReport(gpu_uuid=gpu_uuid, pod_uid=pod, enforced_w=enforced, draw_w=draw, at=at)


class RedisReports:
    """Reads the agents' hashes, one pipelined HGETALL per node."""

    def __init__(self, client: object) -> None:
        self._r = client

    def reports(self, nodes: Iterable[str]) -> dict[str, list[GpuReport]]:
        names = list(nodes)
        pipe = self._r.pipeline(transaction=False)  # type: ignore[attr-defined]
        for n in names:
            pipe.hgetall(ENFORCEMENT_KEY.format(node=n))
        out: dict[str, list[GpuReport]] = {}
        for n, fields in zip(names, pipe.execute(), strict=True):
            got = [r for k, v in (fields or {}).items()
                   if (r := parse_report(k.decode() if isinstance(k, bytes) else str(k), v)) is not None]
            if got:
                out[n] = got
        return out


@dataclass(frozen=True)
class Charge:
    watts: int
    basis: str  # requested_cap | enforced | max_settable


def pod_charge(pod_uid: str, gpus: int, cap_w: int | None, reports: Mapping[str, Iterable[GpuReport]] | None,
               node: str | None, now: float, fresh_s: float, max_settable_w: int) -> Charge:
    """What one GPU pod is charged: its annotation's cap where it has one; else the enforced limits
    of its GPUs where every one of them has a fresh report for this pod; else the maximum settable
    limit per GPU."""
    if cap_w is not None:
        return Charge(cap_w * gpus, "requested_cap")
    mine = [r for r in (reports or {}).get(node or "", []) if r.pod_uid == pod_uid and now - r.at <= fresh_s]
    if gpus and len(mine) >= gpus:
        return Charge(sum(sorted((r.enforced_w for r in mine), reverse=True)[:gpus]), "enforced")
    return Charge(max_settable_w * gpus, "max_settable")


@dataclass(frozen=True)
class Evidence:
    """What an evaluation knows of the agents' enforcement (``budget.require_enforcement_evidence``)."""

    reports: Mapping[str, list[GpuReport]]  # node -> its GPUs' reports
    now: float
    fresh_s: float
    max_settable_w: int  # per GPU: the charge without fresh, matching evidence


def stale_evidence(pods: Iterable[object], reports: Mapping[str, Iterable[GpuReport]], now: float, fresh_s: float,
                   cap_w: int, gpus_per_pod: int) -> str | None:
    """Why a role's enforcement evidence does not hold (None: every live pod of it has a fresh report
    for each of its GPUs, for this pod, enforcing exactly the requested cap)."""
    for pod in pods:
        if not getattr(pod, "is_running_or_starting", True):
            continue
        name, uid, node = getattr(pod, "name", "?"), getattr(pod, "uid", ""), getattr(pod, "node_name", None) or ""
        fresh = [r for r in reports.get(node, []) if r.pod_uid == uid and now - r.at <= fresh_s]
        if len(fresh) < gpus_per_pod:
            return f"pod {name}: {len(fresh)} of {gpus_per_pod} GPUs with a fresh enforcement report"
        wrong = [r for r in fresh if r.enforced_w != cap_w]
        if wrong:
            return f"pod {name}: GPU {wrong[0].gpu_uuid} enforces {wrong[0].enforced_w} W, not the requested {cap_w} W"
    return None


@dataclass(frozen=True)
class EvidenceSource:
    """Where an evaluation reads enforcement evidence from, and how it judges it."""

    reports: EnforcementReports
    fresh_s: float
    max_settable_w: int

    def read(self, nodes: Iterable[str], now: float) -> Evidence:
        return Evidence(self.reports.reports(sorted(set(nodes))), now, self.fresh_s, self.max_settable_w)
