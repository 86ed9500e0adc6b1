"""Budget planner speed benchmark (not a test).

1. Plans per second on random two-role inputs (``powerfleet.budget.plan``).
2. One fleet-wide evaluation of 1,000 deployments on 1,000 nodes in 50 racks: the tick's
   group allowances (``budget.fleet.group_limits``) plus every deployment's evaluation program
   (``budget.program.evaluate``), all pure, from snapshots built in memory. Goal: well inside
   one 30 s evaluation interval.
3. A full tick against the loopback API server and an embedded redis-server: the tick's reads
   (nodes, DGDs, every pod with its GPUs, the agents' enforcement reports) and group allowances,
   then every deployment's evaluation as ``budget.evaluate`` runs it (DGD GET, status ConfigMap
   GET, pod LIST, scaling adapters, writes), one after another in this process, counting the
   API calls. The fleet runs the evaluations on the control workers in parallel.

Usage: python bench/budget.py [--plans N] [--deployments N] [--nodes N] [--racks N] [--seed S] [--no-api]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time

from powerfleet.budget.fleet import DeploymentView, group_limits
from powerfleet.budget.planner import Budget, RoleFacts, plan
from powerfleet.budget.program import DeploymentBudget, Snapshot, evaluate
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION, parse_dgd
from powerfleet.cluster.immutability import admit_power_inputs
from powerfleet.cluster.objects import PodInfo


def random_inputs(rng: random.Random, n: int) -> list[tuple[dict[str, RoleFacts], Budget]]:
    out = []
    for _ in range(n):
        roles = {r: RoleFacts(watts_per_replica=rng.randint(300, 5600), gpus_per_replica=rng.choice([1, 2, 4, 8]),
                              min_replicas=1, ready=rng.randint(0, 12), proposed=rng.choice([None, rng.randint(0, 16)]),
                              rolling=rng.random() < 0.1) for r in ("prefill", "decode")}
        out.append((roles, Budget(rng.randint(15_000, 60_000), rng.choice([-1, rng.randint(16, 64)]))))
    return out


def bench_plans(n: int, seed: int) -> float:
    inputs = random_inputs(random.Random(seed), n)
    t = time.perf_counter()
    for roles, budget in inputs:
        plan(roles, budget)
    return n / (time.perf_counter() - t)


def fleet(deployments: int, nodes: int, racks: int, seed: int) -> tuple[list[DeploymentView], dict[str, str], dict[str, int]]:
    rng = random.Random(seed)
    node_names = [f"gpu-{i:04d}" for i in range(nodes)]
    node_groups = {n: f"rack-{i % racks:02d}" for i, n in enumerate(node_names)}
    views = []
    for d in range(deployments):
        name, rack = f"dgd-{d:04d}", d % racks
        rack_nodes = [n for i, n in enumerate(node_names) if i % racks == rack]
        counts = {"prefill": rng.randint(1, 3), "decode": rng.randint(1, 3)}
        comps = [{"name": c, "type": c, "replicas": k, "podTemplate": {
            "metadata": {"annotations": {POWER_ANNOTATION: "350"}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
            for c, k in counts.items()]
        status = {"observedGeneration": 1, "rollingUpdate": {"phase": "Completed"}, "components": {
            c: {"replicas": k, "readyReplicas": k, "updatedReplicas": k, "rollout": {"phase": "Completed"}}
            for c, k in counts.items()}}
        dgd = parse_dgd({"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
                         "metadata": {"name": name, "namespace": "default", "generation": 1},
                         "spec": {"components": comps}, "status": status})
        pods = [PodInfo(name=f"{name}-{c}-{i}", namespace="default", node_name=rng.choice(rack_nodes), phase="Running",
                        labels={LABEL_DGD_NAME: name, LABEL_COMPONENT: c}, annotations={POWER_ANNOTATION: "350"})
                for c, k in counts.items() for i in range(k)]
        views.append(DeploymentView(key=f"default/{name}", dgd=dgd, admitted=admit_power_inputs(dgd),
                                    budget=DeploymentBudget(power_limit_w=4000),
                                    proposal={"prefill": rng.randint(1, 6), "decode": rng.randint(1, 6)}, pods=pods))
    budgets = {f"rack-{r:02d}": 35_000 for r in range(racks)}
    return views, node_groups, budgets


def bench_fleet(deployments: int, nodes: int, racks: int, seed: int) -> tuple[float, float, int]:
    views, node_groups, budgets = fleet(deployments, nodes, racks, seed)
    t = time.perf_counter()
    limits = group_limits(views, node_groups, budgets, "powerfleet.io/rack")
    t_groups = time.perf_counter() - t
    scaled = 0
    for v in views:
        res = evaluate(Snapshot(dgd=v.dgd, pods=v.pods, budget=v.budget, admitted=v.admitted, proposal=v.proposal,
                                group=limits[v.key], now="2026-11-30T00:00:00Z"))
        scaled += bool(res.replicas)
    return t_groups, time.perf_counter() - t, scaled


def bench_api_tick(deployments: int, nodes: int, racks: int, seed: int) -> dict[str, float]:
    """The full tick against a loopback API server: seconds and API calls, for the tick's reads and
    for the evaluations."""
    import tempfile
    from pathlib import Path

    import redis

    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.budget.evidence import ENFORCEMENT_KEY, EvidenceSource, RedisReports
    from powerfleet.budget.persist import ConfigMapStatus
    from powerfleet.budget.runner import evaluate_deployment
    from powerfleet.budget.state import BudgetState
    from powerfleet.budget.tick import budget_of, tick_limits
    from powerfleet.clock import FakeClock
    from powerfleet.cluster.budget_store import KubeBudgetStore
    from powerfleet.cluster.dra import KubeDra
    from powerfleet.cluster.gpu_pods import KubeGpuPods
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.cluster.scaling import KubeScaling
    from powerfleet.config.fleet import DeploymentBudgetConfig
    from powerfleet.twin.apiserver import ApiServer
    logging.getLogger("powerfleet").setLevel(logging.ERROR)  # holds and warnings are expected here
    views, node_groups, budgets = fleet(deployments, nodes, racks, seed)
    with EmbeddedRedis() as broker, ApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        for n, g in node_groups.items():
            # 8 allocatable GPUs each: the tick's GPU-capacity ceiling (budget/capacity.py) is computed
            api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"powerfleet.io/rack": g}},
                       "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
        for v in views:
            comps = [{"name": c.name, "type": c.name, "replicas": c.replicas, "podTemplate": {
                "metadata": {"annotations": {POWER_ANNOTATION: "350"}},
                "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
                for c in v.dgd.components]
            status = {"observedGeneration": 1, "rollingUpdate": {"phase": "Completed"}, "components": {
                c.name: {"replicas": c.replicas, "readyReplicas": c.replicas, "updatedReplicas": c.replicas}
                for c in v.dgd.components}}
            api.apply({"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
                       "metadata": {"name": v.dgd.name, "namespace": "default"},
                       "spec": {"components": comps}, "status": status})
            for p in v.pods:
                api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": p.name, "namespace": "default", "labels": p.labels, "annotations": p.annotations},
                    "spec": {"nodeName": p.node_name, "containers": [{"name": "main", "resources": {
                        "limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}})
        r = redis.Redis.from_url(broker.url)
        clock = FakeClock(t=1_800_000_000.0)
        # Every node's agent reports its pods' GPUs enforced at their cap (budget.enforcement_evidence
        # auto, the default: the evaluations judge them).
        pipe = r.pipeline(transaction=False)
        for i, p in enumerate(api.list("v1", "Pod", "default")):
            pipe.hset(ENFORCEMENT_KEY.format(node=p["spec"]["nodeName"]), f"GPU-{i}", json.dumps(
                {"pod_uid": p["metadata"]["uid"], "enforced_w": 350, "draw_w": 300.0, "at": clock.now()}))
        pipe.execute()
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(Path(tmp) / "kc")))
        calls = {"n": 0}
        request = kube.api_client.rest_client.request

        def counted(*a, **kw):
            calls["n"] += 1
            return request(*a, **kw)

        kube.api_client.rest_client.request = counted
        state = BudgetState(r)
        for v in views:
            state.admit(v.key, v.admitted)
            state.propose(v.key, dict(v.proposal or {}), at=0, source="bench")
        cfg = {v.key: DeploymentBudgetConfig(power_limit_w=4000) for v in views}
        scaling = KubeScaling(kube)
        evidence = EvidenceSource(RedisReports(r, clock.now()), 45.0, 1000, "auto")
        t0 = time.perf_counter()
        plan = tick_limits(kube, state, cfg, budgets, "powerfleet.io/rack", KubeGpuPods(kube), RedisReports(r),
                           now=clock.now(), fresh_s=45.0, max_settable_w=1000, dra=KubeDra(kube))
        t_tick, tick_calls = time.perf_counter() - t0, calls["n"]
        scaled = 0

        def evaluations() -> None:
            nonlocal scaled
            for v in views:
                out = evaluate_deployment(kube, state, v.key, budget_of(cfg[v.key]), plan.limits[v.key], clock,
                                          ConfigMapStatus(KubeBudgetStore(kube)), scaling, KubeDra(kube), evidence)
                scaled += bool(out.replicas_written)

        evaluations()
        total, first_calls = time.perf_counter() - t0, calls["n"]
        # the next tick: no operator runs here, so the scaled deployments stay in flight (held, figures unchanged)
        t1 = time.perf_counter()
        plan = tick_limits(kube, state, cfg, budgets, "powerfleet.io/rack", KubeGpuPods(kube), RedisReports(r),
                           now=clock.now(), fresh_s=45.0, max_settable_w=1000, dra=KubeDra(kube))
        evaluations()
        steady, steady_calls = time.perf_counter() - t1, calls["n"] - first_calls
        kube.close()
    return {"tick_s": t_tick, "tick_calls": tick_calls, "total_s": total, "calls": first_calls, "scaled": scaled,
            "steady_s": steady, "steady_calls": steady_calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=50_000)
    ap.add_argument("--deployments", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--racks", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-api", action="store_true", help="skip the full tick against the loopback API server")
    args = ap.parse_args()
    print(f"plans/s (random two-role inputs, {args.plans}): {bench_plans(args.plans, args.seed):,.0f}")
    t_groups, total, scaled = bench_fleet(args.deployments, args.nodes, args.racks, args.seed)
    print(f"fleet evaluation ({args.deployments} deployments, {args.nodes} nodes, {args.racks} racks): "
          f"{total:.3f} s (group allowances {t_groups:.3f} s; {scaled} deployments scaled; goal << 30 s)")
    if not args.no_api:
        got = bench_api_tick(args.deployments, args.nodes, args.racks, args.seed)
        per = (got["calls"] - got["tick_calls"]) / max(1, args.deployments)
        print(f"full tick against the loopback API server ({args.deployments} deployments, {args.nodes} nodes, "
              f"{args.racks} racks): tick reads + allowances {got['tick_s']:.2f} s in {got['tick_calls']:.0f} API calls; "
              f"with every evaluation run in turn {got['total_s']:.1f} s, {got['calls']:.0f} API calls "
              f"({per:.1f} per deployment; {got['scaled']:.0f} scaled); the next tick (the scaled ones now in flight) "
              f"{got['steady_s']:.1f} s, {got['steady_calls']:.0f} API calls")


if __name__ == "__main__":
    main()
