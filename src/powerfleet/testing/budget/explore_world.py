"""The cluster the budget exploration drives (issue 30 item 3): the loopback API server, a real
Redis, nodes on two racks and one in no group, an operator and a scheduler of its own (pods created
Pending, bound where their nodeSelector admits and GPUs are free, started late, Terminating until
removed), agents that report, die and return, and the truth each rack's watts are checked against.

The truth is computed independently of the ledger, from the API server's objects and the agents'
hashes: every pod on a rack's nodes at, per GPU, the larger of its annotation and its fresh enforced
limit (the maximum settable limit where neither is known). ``projected`` adds what may still land on
the rack: every pod without a node that its nodeSelector admits there, and every replica a DGD wants
and has no pod for yet (the operator will create it)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from powerfleet.budget.evidence import ENFORCEMENT_KEY
from powerfleet.budget.state import BudgetState
from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION, parse_dgd
from powerfleet.cluster.gpu_pods import pod_gpus
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config.fleet import DeploymentBudgetConfig
from powerfleet.twin.apiserver import ApiServer
from powerfleet.testing.budget.routes import MAX_SETTABLE_W, RACK, node, report, tenant
from powerfleet.testing.budget.routes import pod_cap as cap_of
from powerfleet.testing.budget.stand_in_operator import component_status

DGD_V, DGD_KIND = "nvidia.com/v1beta1", "DynamoGraphDeployment"
NODES = {"gpu-0": "r1", "gpu-1": "r1", "gpu-2": "r2", "loose": None}
GPUS_PER_NODE = 8
CAP_W = 500  # the listed deployments' cap per GPU
AGENT_LABELS = {"app.kubernetes.io/part-of": "powerfleet", "app.kubernetes.io/component": "agent"}


def live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def terminating(pod: Mapping[str, Any]) -> bool:
    return (pod.get("metadata") or {}).get("deletionTimestamp") is not None


def admits(pod_spec: Mapping[str, Any], node_name: str) -> bool:
    labels = {RACK: NODES[node_name]} if NODES[node_name] else {}
    return all(labels.get(k) == v for k, v in (pod_spec.get("nodeSelector") or {}).items())


def dgd_body(name: str, kind: str, prefill: int, decode: int, rack: str | None) -> dict[str, Any]:
    """``kind``: ok (cap 500), typo (cap 45O) or main (GPU components typed main, cap 450)."""
    cap = {"ok": str(CAP_W), "typo": "45O", "main": "450"}[kind]

    def comp(cname: str, replicas: int) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": "engine",
                                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        if rack:
            spec["nodeSelector"] = {RACK: rack}
        return {"name": cname, "type": "main" if kind == "main" else cname, "replicas": replicas,
                "podTemplate": {"metadata": {"annotations": {POWER_ANNOTATION: cap}}, "spec": spec}}
    return {"apiVersion": DGD_V, "kind": DGD_KIND, "metadata": {"name": name, "namespace": "default"},
            "spec": {"components": [{"name": "Frontend", "type": "frontend", "replicas": 1},
                                    comp("prefill", prefill), comp("decode", decode)]}}


@dataclass
class World:
    api: ApiServer
    kube: KubeCluster
    r: redis.Redis
    clock: FakeClock
    limits: dict[str, int] = field(default_factory=lambda: {"r1": 6000, "r2": 3000})
    cfg: dict[str, DeploymentBudgetConfig] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # deployment key -> ok | typo | main
    dead_agents: set[str] = field(default_factory=set)
    names: Any = field(default_factory=lambda: itertools.count())

    @property
    def state(self) -> BudgetState:
        return BudgetState(self.r)

    def setup(self) -> None:
        for n, rack in NODES.items():
            node(self.api, n, rack, gpus=GPUS_PER_NODE)
            tenant(self.api, f"agent-{n}", 0, node_name=n, namespace="powerfleet", labels=AGENT_LABELS)

    # -- the cluster's events --

    def add_deployment(self, kind: str, prefill: int, decode: int, rack: str | None, placed: bool = True) -> str:
        """``placed``: already running when listed (its pods placed and started); else its pods wait, Pending."""
        name = f"d{next(self.names)}"
        self.api.apply(dgd_body(name, kind, prefill, decode, rack))
        key = f"default/{name}"
        self.cfg[key] = DeploymentBudgetConfig(power_limit_w=20_000)
        self.kinds[key] = kind
        self.operate(key)
        if placed:
            self.schedule_all([0])
            self.start_all()
            self.operate(key)
        return key

    def operate_all(self) -> None:
        for key in sorted(self.kinds):
            self.operate(key)

    def schedule_all(self, node_picks: list[int]) -> None:
        unbound = sorted(p["metadata"]["name"] for p in self.pods() if not p["spec"].get("nodeName"))
        for i, name in enumerate(unbound):
            self.schedule(0, node_picks[i % len(node_picks)], only=name)

    def start_all(self) -> None:
        while self.start(0):
            pass

    def add_tenant(self, gpus: int, cap: str | None, where: str | None, rack: str | None) -> None:
        tenant(self.api, f"t{next(self.names)}", gpus, cap=cap, node_name=where,
               node_selector={RACK: rack} if rack else None)

    def pods(self) -> list[dict[str, Any]]:
        return [p for p in self.api.list("v1", "Pod") if live(p)]

    def operate(self, key: str) -> None:
        """The operator's pass over one DGD: a missing pod is created Pending (no node), an extra one
        Terminating (newest first); status counts the Running, non-Terminating pods as ready."""
        ns, name = key.split("/")
        obj = self.api.get(DGD_V, DGD_KIND, name, ns)
        d = parse_dgd(obj)
        mine = [p for p in self.pods() if (p["metadata"].get("labels") or {}).get(LABEL_DGD_NAME) == name]
        statuses: dict[str, Any] = {}
        for c in d.components:
            raw = next(x for x in obj["spec"]["components"] if x["name"] == c.name)
            if "podTemplate" not in raw:
                statuses[c.name] = component_status(name, c.name, c.replicas, ready=c.replicas)
                continue
            pods = [p for p in mine if p["metadata"]["labels"].get(LABEL_COMPONENT) == c.name]
            keep = sorted((p for p in pods if not terminating(p)), key=lambda p: p["metadata"]["name"])
            for _ in range(c.replicas - len(keep)):
                tmpl = raw["podTemplate"]
                self.api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": f"{name}-{c.name}-{next(self.names)}", "namespace": ns,
                    "labels": {LABEL_DGD_NAME: name, LABEL_COMPONENT: c.name},
                    "annotations": dict(tmpl["metadata"]["annotations"])}, "spec": dict(tmpl["spec"]),
                    "status": {"phase": "Pending", "conditions": [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
            for p in keep[c.replicas:] if len(keep) > c.replicas else []:
                p["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
                self.api.apply(p)
            ready = sum(1 for p in keep[:c.replicas] if p["status"].get("phase") == "Running")
            statuses[c.name] = component_status(name, c.name, c.replicas, ready=ready)
        self.kube.patch_dgd_status(ns, name, {"observedGeneration": d.generation, "state": "successful",
                                              "rollingUpdate": {"phase": "Completed"}, "components": statuses})

    def free_gpus(self) -> dict[str, int]:
        used = {n: 0 for n in NODES}
        for p in self.pods():
            if (n := (p.get("spec") or {}).get("nodeName")) in used:
                used[n] += pod_gpus(p["spec"])
        return {n: GPUS_PER_NODE - u for n, u in used.items()}

    def schedule(self, pick: int, node_pick: int, only: str | None = None) -> None:
        """Bind one unbound pod (``only``: that one) to a node its nodeSelector admits with GPUs free
        (the choice is the exploration's: any admitted node may get it); one that fits nowhere stays Pending."""
        unbound = sorted((p for p in self.pods() if not p["spec"].get("nodeName") and not terminating(p)
                          and only in (None, p["metadata"]["name"])), key=lambda p: p["metadata"]["name"])
        if not unbound:
            return
        p = unbound[pick % len(unbound)]
        free = self.free_gpus()
        fits = [n for n in NODES if admits(p["spec"], n) and free[n] >= pod_gpus(p["spec"])]
        if fits:
            p["spec"]["nodeName"] = fits[node_pick % len(fits)]
            p["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
            self.api.apply(p)

    def start(self, pick: int) -> bool:
        """A bound pod's containers start (Running); False when none is waiting to."""
        bound = sorted((p for p in self.pods() if p["spec"].get("nodeName") and p["status"].get("phase") == "Pending"),
                       key=lambda p: p["metadata"]["name"])
        if bound:
            p = bound[pick % len(bound)]
            p["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
            self.api.apply(p)
        return bool(bound)

    def remove_terminating(self) -> None:
        for p in self.pods():
            if terminating(p):
                self.api.delete("v1", "Pod", p["metadata"]["name"], p["metadata"]["namespace"])

    def agents_report(self, clamp: bool = False) -> None:
        """Every live agent publishes a fresh report for each GPU of each Running pod on its node:
        the cap it enforced (``clamp``: clamped up to the device minimum, 400 W), or the default (the
        maximum settable limit) for a pod without one."""
        for n in NODES:
            if n in self.dead_agents:
                continue
            self.r.delete(ENFORCEMENT_KEY.format(node=n))
            for p in self.pods():
                if p["spec"].get("nodeName") == n and p["status"].get("phase") == "Running" and pod_gpus(p["spec"]):
                    cap = cap_of(p)
                    report(self.r, n, p["metadata"]["uid"], MAX_SETTABLE_W if cap is None else max(cap, 400 if clamp else 0),
                           at=self.clock.now(), gpus=pod_gpus(p["spec"]))
            if not self.r.exists(ENFORCEMENT_KEY.format(node=n)):  # an agent with nothing to report still publishes
                self.r.hset(ENFORCEMENT_KEY.format(node=n), "heartbeat", "no evidence")

    def agent_dies(self, n: str) -> None:
        self.dead_agents.add(n)
        self.r.delete(ENFORCEMENT_KEY.format(node=n))  # its hash expired
