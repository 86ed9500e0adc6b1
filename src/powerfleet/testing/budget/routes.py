"""Helpers for driving the budget's real tick and evaluation against the loopback API server and a
real Redis (issue 30): nodes, tenant pods (placed or Pending as a real scheduler leaves them), one
round of ``tick_limits`` plus every ``evaluate_deployment``, and each rack's watts computed
independently from every pod on its nodes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from powerfleet.budget.evidence import ENFORCEMENT_KEY, EvidenceSource, RedisReports
from powerfleet.budget.persist import ConfigMapStatus
from powerfleet.budget.program import DeploymentBudget
from powerfleet.budget.runner import Outcome, evaluate_deployment
from powerfleet.budget.state import BudgetState
from powerfleet.budget.tick import TickPlan, tick_limits
from powerfleet.clock import FakeClock
from powerfleet.cluster.budget_store import KubeBudgetStore
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.gpu_pods import KubeGpuPods, pod_gpus
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.scaling import KubeScaling
from powerfleet.config.fleet import DeploymentBudgetConfig
from powerfleet.twin.apiserver import ApiServer

RACK = "powerfleet.io/rack"
MAX_SETTABLE_W = 1000
FRESH_S = 90.0


def node(api: ApiServer, name: str, rack: str | None = "r1", gpus: int | None = None) -> None:
    api.apply({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": name, "labels": {} if rack is None else {RACK: rack}},
               **({} if gpus is None else {"status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}})})


def tenant(api: ApiServer, name: str, gpus: int, cap: str | None = None, node_name: str | None = "gpu-1",
           namespace: str = "other", labels: Mapping[str, str] | None = None,
           node_selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod no listed deployment owns; ``node_name`` None: Pending, as a scheduler that found no
    node leaves it (no nodeName, ``PodScheduled=False``, reason ``Unschedulable``)."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "train",
                                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name is not None:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    status: dict[str, Any] = {"phase": "Running"} if node_name else {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": namespace, "labels": dict(labels or {}),
        "annotations": {} if cap is None else {POWER_ANNOTATION: cap}}, "spec": spec, "status": status}
    api.apply(body)
    return api.get("v1", "Pod", name, namespace)


def report(r: redis.Redis, node_name: str, pod_uid: str, enforced_w: int, at: float, gpus: int = 1,
           draw_w: float = 0.0) -> None:
    """An agent's enforcement report for each of a pod's GPUs (agent/evidence.py's shape)."""
    r.hset(ENFORCEMENT_KEY.format(node=node_name), mapping={
        f"GPU-{pod_uid}-{i}": json.dumps({"pod_uid": pod_uid, "enforced_w": enforced_w, "draw_w": draw_w, "at": at})
        for i in range(gpus)})


@dataclass
class Round:
    plan: TickPlan
    outcomes: dict[str, Outcome]


def configs(limits: Mapping[str, int], **extra: Any) -> dict[str, DeploymentBudgetConfig]:
    return {k: DeploymentBudgetConfig(power_limit_w=w, **extra) for k, w in limits.items()}


def tick_and_evaluate(kube: KubeCluster, state: BudgetState, r: redis.Redis, cfg: Mapping[str, Any],
                      groups: Mapping[str, int], clock: FakeClock, *, evaluate: bool = True,
                      mode: str = "auto") -> Round:
    """One budget tick (the real ``tick_limits``) and, with ``evaluate``, every deployment's real
    ``evaluate_deployment`` with the allowance the tick computed (its ConfigMap status, its adapters,
    the agents' reports in Redis)."""
    plan = tick_limits(kube, state, cfg, groups, RACK, KubeGpuPods(kube), RedisReports(r, clock.now()),
                       now=clock.now(), fresh_s=FRESH_S, max_settable_w=MAX_SETTABLE_W,
                       evidence_mode=mode)  # type: ignore[arg-type]
    outcomes: dict[str, Outcome] = {}
    if evaluate:
        source = EvidenceSource(RedisReports(r, clock.now()), FRESH_S, MAX_SETTABLE_W, mode)  # type: ignore[arg-type]
        for key, gl in plan.limits.items():
            c = cfg[key]
            outcomes[key] = evaluate_deployment(
                kube, state, key, DeploymentBudget(power_limit_w=c.power_limit_w, min_replicas=dict(c.min_replicas)),
                gl, clock, ConfigMapStatus(KubeBudgetStore(kube)), KubeScaling(kube), evidence=source)
    return Round(plan, outcomes)


def pod_cap(pod: Mapping[str, Any]) -> int | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(POWER_ANNOTATION)
    try:
        return int(str(raw).strip()) if raw is not None else None
    except ValueError:
        return None


def fresh_enforced(r: redis.Redis, nodes: list[str], now: float) -> dict[tuple[str, str], list[int]]:
    """(node, pod UID) -> the fresh enforced limits its agent reports for that pod's GPUs."""
    out: dict[tuple[str, str], list[int]] = {}
    for n in nodes:
        for v in r.hgetall(ENFORCEMENT_KEY.format(node=n)).values():
            try:
                rep = json.loads(v)
                if now - float(rep["at"]) <= FRESH_S and isinstance(rep["enforced_w"], int):
                    out.setdefault((n, rep["pod_uid"]), []).append(rep["enforced_w"])
            except (ValueError, KeyError, TypeError):
                continue
    return out


def pod_truth(pod: Mapping[str, Any], enforced: Mapping[tuple[str, str], list[int]]) -> int:
    """One pod's watts, per GPU the larger of its annotation and its fresh enforced limit, the maximum
    settable limit where neither is known."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    gpus, cap = pod_gpus(spec), pod_cap(pod)
    limits = sorted(enforced.get((spec.get("nodeName") or "", meta.get("uid", "")), []), reverse=True)[:gpus]
    return sum(max(cap or 0, limits[i]) if i < len(limits) else (cap if cap is not None else MAX_SETTABLE_W)
               for i in range(gpus))


def rack_watts(api: ApiServer, r: redis.Redis, now: float) -> dict[str, int]:
    """rack -> the watts of every pod on its nodes, computed independently of the ledger
    (``pod_truth``; Terminating pods included until gone; Succeeded and Failed hold nothing)."""
    racks = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(RACK) for n in api.list("v1", "Node")}
    enforced = fresh_enforced(r, list(racks), now)
    out: dict[str, int] = {}
    for pod in api.list("v1", "Pod"):
        where = (pod.get("spec") or {}).get("nodeName")
        rack = racks.get(where) if where else None
        if rack is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        out[rack] = out.get(rack, 0) + pod_truth(pod, enforced)
    return out
