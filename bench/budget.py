"""Budget planner speed benchmark (not a test).

1. Plans per second on random two-role inputs (``powerfleet.budget.plan``).
2. One fleet-wide evaluation of 1,000 deployments on 1,000 nodes in 50 racks: the tick's
   group allowances (``budget.fleet.group_limits``) plus every deployment's evaluation program
   (``budget.program.evaluate``), all pure, from snapshots built in memory. Goal: well inside
   one 30 s evaluation interval.

Usage: python bench/budget.py [--plans N] [--deployments N] [--nodes N] [--racks N] [--seed S]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=50_000)
    ap.add_argument("--deployments", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--racks", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    print(f"plans/s (random two-role inputs, {args.plans}): {bench_plans(args.plans, args.seed):,.0f}")
    t_groups, total, scaled = bench_fleet(args.deployments, args.nodes, args.racks, args.seed)
    print(f"fleet evaluation ({args.deployments} deployments, {args.nodes} nodes, {args.racks} racks): "
          f"{total:.3f} s (group allowances {t_groups:.3f} s; {scaled} deployments scaled; goal << 30 s)")


if __name__ == "__main__":
    main()
