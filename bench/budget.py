"""Budget planner speed benchmark (not a test).

1. Plans per second on random two-role inputs (``powerfleet.budget.plan``).
2. One fleet-wide evaluation of 1,000 deployments on 1,000 nodes in 50 racks: the tick's
   group allowances (``budget.fleet.group_limits``) plus every deployment's evaluation program
   (``budget.program.evaluate``), all pure, from snapshots built in memory. Goal: well inside
   one 30 s evaluation interval.
3. A full tick against the loopback API server and an embedded redis-server: the tick's reads
   (nodes, DGDs, every pod with its GPUs in pages, the agents' enforcement reports), group
   allowances and their publication under a generation, then every deployment's evaluation as
   ``budget.evaluate_batch`` runs it (one snapshot: DGD LIST, status ConfigMap LIST, DGD pod LIST,
   scaling adapters per namespace; then each deployment's allowance read from Redis and its
   writes), in this one process, counting the API calls: the scaling tick's evaluation wall time,
   calls per scaled deployment and calls for the unchanged ones. ``--unbatched`` also runs them
   each with its own reads (DGD GET, ConfigMap GET, pod LIST, adapters), as before batching.

Each deployment's pods carry a nodeSelector on their rack (``--unpinned``: none, so every scale-up is
bounded by all 50 racks' free watts, docs/budget.md routes 9 and 11).

Usage: python bench/budget.py [--plans N] [--deployments N] [--nodes N] [--racks N] [--seed S] [--no-api] [--unbatched]
       [--unpinned]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from collections import Counter

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


def fleet(deployments: int, nodes: int, racks: int, seed: int,
          scale: int = 1) -> tuple[list[DeploymentView], dict[str, str], dict[str, int]]:
    """``scale``: replicas, proposals, limits and rack budgets times this (bench/scale.py: 8 GPU pods per node)."""
    rng = random.Random(seed)
    node_names = [f"gpu-{i:04d}" for i in range(nodes)]
    node_groups = {n: f"rack-{i % racks:02d}" for i, n in enumerate(node_names)}
    views = []
    by_rack = [node_names[r::racks] for r in range(racks)]
    for d in range(deployments):
        name, rack = f"dgd-{d:04d}", d % racks
        rack_nodes = by_rack[rack]
        counts = {"prefill": rng.randint(1, 3) * scale, "decode": rng.randint(1, 3) * scale}
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
                                    budget=DeploymentBudget(power_limit_w=4000 * scale),
                                    proposal={"prefill": rng.randint(1, 6) * scale, "decode": rng.randint(1, 6) * scale},
                                    pods=pods))
    budgets = {f"rack-{r:02d}": 35_000 * scale for r in range(racks)}
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


def _seed_world(api, r, views, node_groups, now: float, pinned: bool = True) -> None:
    """The loopback server's nodes, DGDs and pods, and every node's agent reporting its pods' GPUs.
    ``pinned``: each deployment's pods carry a nodeSelector on their rack (else none: a scale-up may
    land on any of the 50 racks, so each of them bounds it, docs/budget.md route 9)."""
    from powerfleet.budget.evidence import ENFORCEMENT_KEY

    for n, g in node_groups.items():
        # 8 allocatable GPUs each: the tick's GPU-capacity ceiling (budget/capacity.py) is computed
        api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"powerfleet.io/rack": g}},
                   "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    for v in views:
        comps = [{"name": c.name, "type": c.name, "replicas": c.replicas, "podTemplate": {
            "metadata": {"annotations": {POWER_ANNOTATION: "350"}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
            for c in v.dgd.components]
        # as Dynamo's operator writes it (the fields its CRD requires), so the server accepts status writes
        status = {"observedGeneration": 1, "state": "successful", "rollingUpdate": {"phase": "Completed"},
                  "components": {c.name: {"componentKind": "Deployment", "componentNames": [f"{v.dgd.name}-{c.name}"],
                                          "replicas": c.replicas, "readyReplicas": c.replicas,
                                          "updatedReplicas": c.replicas, "availableReplicas": c.replicas}
                                 for c in v.dgd.components}}
        api.apply({"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
                   "metadata": {"name": v.dgd.name, "namespace": "default"},
                   "spec": {"components": comps}, "status": status})
        for p in v.pods:
            selector = {"nodeSelector": {"powerfleet.io/rack": node_groups[p.node_name]}} if pinned else {}
            api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": p.name, "namespace": "default", "labels": p.labels, "annotations": p.annotations},
                "spec": {"nodeName": p.node_name, **selector, "containers": [{"name": "main", "resources": {
                    "limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}})
    # Every node's agent reports its pods' GPUs enforced at their cap (budget.enforcement_evidence
    # auto, the default: the evaluations judge them).
    pipe = r.pipeline(transaction=False)
    for i, p in enumerate(api.list("v1", "Pod", "default")):
        pipe.hset(ENFORCEMENT_KEY.format(node=p["spec"]["nodeName"]), f"GPU-{i}", json.dumps(
            {"pod_uid": p["metadata"]["uid"], "enforced_w": 350, "draw_w": 300.0, "at": now}))
    pipe.execute()


def count_calls(kube) -> dict[str, int]:
    """Count the client's API calls and response bytes from now on: {"n": calls, "bytes": bytes, "by": calls by kind}."""
    calls: dict = {"n": 0, "bytes": 0, "by": Counter()}
    request = kube.api_client.rest_client.request

    def counted(method, url, *a, **kw):
        calls["n"] += 1
        calls["by"][_call_kind(method, url)] += 1
        resp = request(method, url, *a, **kw)
        calls["bytes"] += len(resp.read() or b"")  # read once and kept: the caller reads the same bytes
        return resp

    kube.api_client.rest_client.request = counted
    return calls


def admitted(r, views, scale: int = 1):
    """The deployments admitted in Redis, and their budget config (the bench's power limits)."""
    from powerfleet.budget.state import BudgetState
    from powerfleet.config.fleet import DeploymentBudgetConfig

    state = BudgetState(r)
    for v in views:
        state.admit(v.key, v.admitted)
    return state, {v.key: DeploymentBudgetConfig(power_limit_w=4000 * scale) for v in views}


def small_moves(views, seed: int) -> dict[str, dict[str, int]]:
    """A steady tick's proposals: one role of each deployment one replica up or down (never below 1)."""
    rng = random.Random(seed + 1)
    out = {}
    for v in views:
        comp = rng.choice(v.dgd.components)
        out[v.key] = {comp.name: max(1, comp.replicas + rng.choice((-1, 1)))}
    return out


def bench_api_tick(deployments: int, nodes: int, racks: int, seed: int, batched: bool = True,
                   pinned: bool = True, steady: bool = False, scale: int = 1) -> dict[str, float]:
    """The full tick against a loopback API server: seconds and API calls, for the tick's reads and
    for the evaluations (``batched``: as budget.evaluate_batch runs them, on one snapshot, with the
    generation rule's Redis reads; else each with its own reads, as before batching)."""
    import tempfile
    from pathlib import Path

    import redis

    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.budget.batch import (BatchState, PrefetchedReports, SnapshotCluster, SnapshotScaling,
                                         SnapshotStatus, read_snapshot)
    from powerfleet.budget.evidence import EvidenceSource, RedisReports
    from powerfleet.budget.generations import Allocations, Read, verdict
    from powerfleet.budget.persist import ConfigMapStatus
    from powerfleet.budget.runner import evaluate_deployment
    from powerfleet.budget.tick import budget_of, tick_limits
    from powerfleet.clock import FakeClock
    from powerfleet.cluster.budget_store import KubeBudgetStore
    from powerfleet.cluster.dra import KubeDra
    from powerfleet.cluster.gpu_pods import KubeGpuPods
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.cluster.scaling import KubeScaling
    from powerfleet.tasks.budget import EvaluateResult
    from powerfleet.twin.apiserver import ApiServer
    logging.getLogger("powerfleet").setLevel(logging.ERROR)  # holds and warnings are expected here
    views, node_groups, budgets = fleet(deployments, nodes, racks, seed, scale)
    with EmbeddedRedis() as broker, ApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        r = redis.Redis.from_url(broker.url)
        clock = FakeClock(t=1_800_000_000.0)
        _seed_world(api, r, views, node_groups, clock.now(), pinned)
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(Path(tmp) / "kc")))
        calls = count_calls(kube)
        state, cfg = admitted(r, views, scale)
        scaling = KubeScaling(kube)
        evidence = EvidenceSource(RedisReports(r, clock.now()), 45.0, 1000, "auto")
        allocations = Allocations(r)

        def tick():
            generation = allocations.open(clock.now())
            plan = tick_limits(kube, state, cfg, budgets, "powerfleet.io/rack", KubeGpuPods(kube), RedisReports(r),
                               now=clock.now(), fresh_s=45.0, max_settable_w=1000, dra=KubeDra(kube))
            allocations.publish(generation, plan.limits)
            return generation, plan

        def evaluations(generation, plan) -> dict[str, float]:
            """Wall time, snapshot calls, and calls and counts of the deployments that scaled and not."""
            t, cpu, before, by = time.perf_counter(), time.thread_time(), calls["n"], Counter(calls["by"])
            cluster, sink, scale, st, source = kube, ConfigMapStatus(KubeBudgetStore(kube)), scaling, state, evidence
            if batched:  # as budget.evaluate_batch does it (tasks/budget.py)
                snap = read_snapshot(kube, scaling, list(cfg))
                cluster, sink, scale = SnapshotCluster(kube, snap), SnapshotStatus(KubeBudgetStore(kube), snap), \
                    SnapshotScaling(scaling, snap)
                st, (newest, published, records) = BatchState(state, r), allocations.read_all()
                nodes = [p.node_name for pods in snap.pods.values() for p in pods if p.node_name]
                source = EvidenceSource(PrefetchedReports(RedisReports(r, clock.now()), nodes), 45.0, 1000, "auto")
            got = {"snapshot_calls": calls["n"] - before, "scaled": 0, "scaled_calls": 0, "unchanged": 0,
                   "unchanged_calls": 0, "result_bytes": 0, "events": Counter()}
            for v in views:
                mark = calls["n"]
                group = (verdict(Read(generation, newest, published, records.get(v.key)), clock.now(), 60.0)
                         if batched else plan.limits[v.key])
                out = evaluate_deployment(cluster, st, v.key, budget_of(cfg[v.key]), group, clock, sink, scale,
                                          KubeDra(kube), source,
                                          fence=(lambda: allocations.outdated(generation)) if batched else None)
                kind = "scaled" if out.replicas_written else "unchanged"
                # what the evaluation task's result keeps in Redis for broker.result_expires_s
                got["result_bytes"] += len(EvaluateResult(**{k: getattr(out, k) for k in EvaluateResult.model_fields})
                                           .model_dump_json())
                got[kind] += 1
                got["events"].update(out.events)
                got[f"{kind}_calls"] += calls["n"] - mark
            got["wall_s"], got["cpu_s"] = time.perf_counter() - t, time.thread_time() - cpu
            got["calls"], got["by"] = calls["n"] - before, dict(calls["by"] - by)
            return got

        # a first tick with no proposal: every deployment's status and condition are written once
        # (a fleet's steady state), nothing scales; a second one changes nothing
        evaluations(*tick())
        quiet = evaluations(*tick())  # and again: nothing changed, so nothing is written
        moves = small_moves(views, seed)
        for v in views:
            state.propose(v.key, moves[v.key] if steady else dict(v.proposal or {}), at=0, source="bench")
        t0, c0, start, b0 = time.perf_counter(), time.process_time(), calls["n"], calls["bytes"]
        generation, plan = tick()
        t_tick, tick_calls = time.perf_counter() - t0, calls["n"] - start
        tick_cpu, tick_bytes = time.process_time() - c0, calls["bytes"] - b0
        first = evaluations(generation, plan)  # the scaling tick
        # the next tick: no operator runs here, so the scaled deployments stay in flight (held, figures unchanged)
        generation, plan = tick()
        steady = evaluations(generation, plan)
        kube.close()
    return {"tick_s": t_tick, "tick_calls": tick_calls, "tick_cpu_s": tick_cpu, "tick_bytes": tick_bytes,
            "pods": sum(len(v.pods) for v in views), "quiet": quiet, "first": first, "steady": steady}


def _call_kind(method: str, url: str) -> str:
    """``PATCH configmaps``, ``POST events``, ``PATCH dynamographdeployments/status``: what a call is."""
    path = url.split("?", 1)[0].rstrip("/").split("/")
    kind = path[-1] if path[-1] in ("status", "scale") else ""
    plural = next((seg for seg in reversed(path) if seg in _PLURALS), "other")
    return f"{method} {plural}{'/' + kind if kind else ''}"


_PLURALS = ("events", "configmaps", "pods", "nodes", "dynamographdeployments",
            "dynamographdeploymentscalingadapters", "resourceclaimtemplates")


def _evaluation_line(label: str, got: dict) -> str:
    per = got["scaled_calls"] / got["scaled"] if got["scaled"] else 0.0
    by = ", ".join(f"{k} {v}" for k, v in sorted(got["by"].items(), key=lambda kv: -kv[1]))
    return (f"{label}: evaluations {got['wall_s']:.1f} s ({got['cpu_s']:.1f} s CPU in the evaluating thread), "
            f"{got['calls']:.0f} API calls ({got['snapshot_calls']:.0f} for the snapshot); {got['scaled']:.0f} "
            f"scaled at {per:.2f} calls each; {got['unchanged']:.0f} unchanged, {got['unchanged_calls']:.0f} calls "
            f"in all\n      calls: {by}"
            + (f"\n      events: {', '.join(f'{k} {v}' for k, v in got['events'].most_common())}" if got["events"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=50_000)
    ap.add_argument("--deployments", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--racks", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-api", action="store_true", help="skip the full tick against the loopback API server")
    ap.add_argument("--unbatched", action="store_true", help="also run the evaluations each with its own reads")
    ap.add_argument("--unpinned", action="store_true", help="pods without a nodeSelector on their rack")
    args = ap.parse_args()
    print(f"plans/s (random two-role inputs, {args.plans}): {bench_plans(args.plans, args.seed):,.0f}")
    t_groups, total, scaled = bench_fleet(args.deployments, args.nodes, args.racks, args.seed)
    print(f"fleet evaluation ({args.deployments} deployments, {args.nodes} nodes, {args.racks} racks): "
          f"{total:.3f} s (group allowances {t_groups:.3f} s; {scaled} deployments scaled; goal << 30 s)")
    if not args.no_api:
        for batched in ((True, False) if args.unbatched else (True,)):
            got = bench_api_tick(args.deployments, args.nodes, args.racks, args.seed, batched, not args.unpinned)
            how = "batched, one snapshot" if batched else "each with its own reads (before batching)"
            print(f"full tick against the loopback API server ({args.deployments} deployments, {args.nodes} nodes, "
                  f"{args.racks} racks; {how}, in one process): tick reads + allowances {got['tick_s']:.2f} s in "
                  f"{got['tick_calls']:.0f} API calls")
            print("  " + _evaluation_line("a quiet tick (nothing proposed, statuses already written)", got["quiet"]))
            print("  " + _evaluation_line("the scaling tick (proposals 1-6 per role: most clamped)", got["first"]))
            print("  " + _evaluation_line("the next tick (the scaled ones in flight)", got["steady"]))
            if batched:
                small = bench_api_tick(args.deployments, args.nodes, args.racks, args.seed, True, not args.unpinned,
                                       steady=True)["first"]
                print("  " + _evaluation_line("a steady scaling tick (one role of each one replica up or down)",
                                              small))

if __name__ == "__main__":
    main()
