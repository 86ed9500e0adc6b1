"""Enforcement evidence: what the ledger charges a GPU (issue 18 items 2 and 8), from the node
agents' per-GPU reports where they exist.

The agents (agent/evidence.py) publish one Redis hash per node, ``powerfleet:enforcement:<node>``,
with a TTL of three reconcile intervals: field = GPU UUID, value = JSON with (among others)
``{"pod_uid": str, "enforced_w": int | null, "draw_w": float, "at": epoch seconds}``, where
``enforced_w`` is a power limit read back from that GPU after a successful write (null when the
write or readback failed: no evidence) and ``draw_w`` the measured draw. A report is fresh while
``now - at <= 3 x interval``.

Because the agent's hash expires by itself, "no hash" cannot tell "no agent here" from "the agent
died": the reader remembers, in ``powerfleet:budget:reporting-nodes``, every node whose agent has
published once; such a node without a fresh report for a GPU is stale evidence, never "no agents".
That set is lost with Redis (a flush, a failover to a replica that missed the write), so each tick
also re-derives it from the cluster: every node an agent pod is bound to is a reporting node.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

ENFORCEMENT_KEY = "powerfleet:enforcement:{node}"
REPORTING_NODES_KEY = "powerfleet:budget:reporting-nodes"  # node -> when its agent was first seen publishing
EvidenceMode = Literal["auto", "required", "off"]


@dataclass(frozen=True)
class GpuReport:
    gpu_uuid: str
    pod_uid: str
    enforced_w: int
    draw_w: float
    at: float


# The agent DaemonSet's pods (the chart's labels): a node running one has an agent, reported or not
AGENT_POD_LABELS = {"app.kubernetes.io/part-of": "powerfleet", "app.kubernetes.io/component": "agent"}


class EnforcementReports(Protocol):
    def reports(self, nodes: Iterable[str], agents: Iterable[str] = ()) -> dict[str, list[GpuReport]]:
        """node -> its GPUs' readable reports. A node is present when its agent publishes or has
        published before, or is in ``agents`` (an empty list: its reports are gone); absent: no
        agent ever reported there."""


class NoReports:
    """No agent publishes reports yet: every GPU without a cap is charged its maximum settable limit."""

    def reports(self, nodes: Iterable[str], agents: Iterable[str] = ()) -> dict[str, list[GpuReport]]:
        return {}


def agent_nodes(pods: Iterable[object]) -> set[str]:
    """The nodes an agent pod (``AGENT_POD_LABELS``) is bound to and not terminal on: each has an
    agent whether or not its reports survived in Redis (a flush or a failover loses them)."""
    out: set[str] = set()
    for p in pods:
        labels = getattr(p, "labels", None) or {}
        node = getattr(p, "node_name", None)
        if node and getattr(p, "phase", None) not in ("Succeeded", "Failed") and all(
                labels.get(k) == v for k, v in AGENT_POD_LABELS.items()):
            out.add(node)
    return out


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
    """Reads the agents' hashes, one pipelined HGETALL per node plus one HMGET of the nodes seen
    reporting before; a node seen for the first time is remembered (one HSET, only then)."""

    def __init__(self, client: object, now: float = 0.0) -> None:
        self._r = client
        self._now = now  # recorded as the first-seen time (informative only)

    def reports(self, nodes: Iterable[str], agents: Iterable[str] = ()) -> dict[str, list[GpuReport]]:
        """``agents``: nodes known to run an agent (``agent_nodes``): remembered as reporting nodes
        now, so the set is re-derived from the cluster after Redis lost it."""
        names = list(dict.fromkeys(nodes))
        deployed = set(agents)
        if not names:
            return {}
        pipe = self._r.pipeline(transaction=False)  # type: ignore[attr-defined]
        for n in names:
            pipe.hgetall(ENFORCEMENT_KEY.format(node=n))
        pipe.hmget(REPORTING_NODES_KEY, names)
        *hashes, seen = pipe.execute()
        out: dict[str, list[GpuReport]] = {}
        first_seen: dict[str, float] = {}
        for n, fields, was in zip(names, hashes, seen, strict=True):
            if fields:  # the agent publishes (even a field that is no evidence says an agent is here)
                out[n] = [r for k, v in fields.items()
                          if (r := parse_report(k.decode() if isinstance(k, bytes) else str(k), v)) is not None]
                if was is None:
                    first_seen[n] = self._now
            elif was is not None or n in deployed:
                out[n] = []  # it published before (or its agent pod runs) and does not: no fresh evidence
                if was is None:
                    first_seen[n] = self._now
        if first_seen:
            self._r.hset(REPORTING_NODES_KEY, mapping=first_seen)  # type: ignore[attr-defined]
        return out


@dataclass(frozen=True)
class Charge:
    watts: int
    basis: str  # requested_cap | enforced | max_settable


def pod_charge(pod_uid: str, gpus: int, cap_w: int | None, reports: Mapping[str, Iterable[GpuReport]] | None,
               node: str | None, now: float, fresh_s: float, max_settable_w: int) -> Charge:
    """What one GPU pod no listed deployment owns is charged. With its annotation's cap: each GPU
    at the larger of the cap and its fresh enforced limit for this pod (an annotation is a request,
    the enforced limit what the GPU may draw). Without: the enforced limits where every one of its
    GPUs has a fresh report for this pod, else the maximum settable limit per GPU."""
    mine = sorted((r.enforced_w for r in (reports or {}).get(node or "", [])
                   if r.pod_uid == pod_uid and now - r.at <= fresh_s), reverse=True)[:gpus]
    if cap_w is not None:
        per_gpu = [max(cap_w, mine[i]) if i < len(mine) else cap_w for i in range(gpus)]
        return Charge(sum(per_gpu), "enforced" if sum(per_gpu) > cap_w * gpus else "requested_cap")
    if gpus and len(mine) >= gpus:
        return Charge(sum(mine), "enforced")
    return Charge(max_settable_w * gpus, "max_settable")


@dataclass(frozen=True)
class Evidence:
    """What an evaluation knows of the agents' enforcement (``budget.enforcement_evidence``)."""

    reports: Mapping[str, list[GpuReport]]  # node -> its GPUs' reports (absent: no agent ever reported there)
    now: float
    fresh_s: float
    max_settable_w: int  # per GPU: the charge without fresh, matching evidence
    mode: EvidenceMode = "auto"  # auto: judged on nodes whose agent reports; required: on every node
    unreadable: bool = False  # the reports could not be read: every node counts as reporting, none fresh


@dataclass(frozen=True)
class RoleCharge:
    """A role's charge basis and what its existing pods cost beyond ``cap x GPUs``."""

    basis: str  # requested_cap | enforced | max_settable (the least proven of its pods)
    surplus_w: int = 0  # stale GPUs at the maximum settable limit, enforced limits above the cap
    stale: str | None = None  # why the evidence does not hold (scale-ups are held)


def role_charge(pods: Iterable[object], evidence: Evidence | None, cap_w: int, gpus_per_pod: int) -> RoleCharge:
    """Each of the role's Running pods on a node whose agent reports (every node: ``required``) is
    judged by its GPUs' reports for this pod UID: with a fresh one for each of its GPUs it is charged
    at the enforced limits where above the cap (an enforced limit below it, the power guard's
    throttle, is not credited: new replicas start at the cap); otherwise at the maximum settable
    limit per GPU, and the role's scale-ups are held. A pod not yet Running has no process for an
    agent to attribute: it keeps the startup reservation of its requested cap (the role is in flight,
    so its scale-ups are held anyway). A pod on a node no agent ever reported from (``auto``) is
    charged its requested cap, as before agents existed."""
    if evidence is None or evidence.mode == "off":
        return RoleCharge("requested_cap")
    bases: set[str] = set()
    surplus = 0
    stale: str | None = None
    for pod in pods:
        node = getattr(pod, "node_name", None)
        if getattr(pod, "phase", None) != "Running" or not node:
            continue
        node_reports = evidence.reports.get(node)
        if node_reports is None and evidence.mode == "auto" and not evidence.unreadable:
            bases.add("requested_cap")
            continue
        uid = getattr(pod, "uid", "")
        fresh = [r for r in node_reports or [] if r.pod_uid == uid and uid and evidence.now - r.at <= evidence.fresh_s]
        if len(fresh) < gpus_per_pod:
            bases.add("max_settable")
            surplus += max(0, evidence.max_settable_w - cap_w) * gpus_per_pod
            if stale is None:
                stale = (f"pod {getattr(pod, 'name', '?')} on {node}: {len(fresh)} of {gpus_per_pod} GPUs "
                         "with a fresh enforcement report")
            continue
        bases.add("enforced")
        surplus += sum(max(0, r.enforced_w - cap_w)
                       for r in sorted(fresh, key=lambda r: r.enforced_w, reverse=True)[:gpus_per_pod])
    basis = next((b for b in ("max_settable", "requested_cap", "enforced") if b in bases), "requested_cap")
    return RoleCharge(basis, surplus, stale)


@dataclass(frozen=True)
class EvidenceSource:
    """Where an evaluation reads enforcement evidence from, and how it judges it."""

    reports: EnforcementReports
    fresh_s: float
    max_settable_w: int
    mode: EvidenceMode = "auto"

    def read(self, nodes: Iterable[str], now: float) -> Evidence:
        return Evidence(self.reports.reports(sorted(set(nodes))), now, self.fresh_s, self.max_settable_w, self.mode)

    def unreadable(self, now: float) -> Evidence:
        return Evidence({}, now, self.fresh_s, self.max_settable_w, self.mode, unreadable=True)
