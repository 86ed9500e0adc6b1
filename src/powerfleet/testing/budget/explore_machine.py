"""The seeded exploration of the budget's state space (issue 30 item 3): a hypothesis state machine
over the real ``tick_limits`` and ``evaluate_deployment`` (src/powerfleet/testing/budget/routes.py) against the loopback
API server and a real Redis (src/powerfleet/testing/budget/explore_world.py), whose steps are what a cluster does.

Invariants, each rack's watts computed independently (``explore_world``):

- **No step of powerfleet's takes a rack over its limit, or further over**: after every step that is
  not the cluster's own doing (a tick, an evaluation, the operator and the scheduler acting on what
  powerfleet wrote, pods starting or going, agents dying, Redis flushed, a 409), each rack's projected
  watts are at most ``max(limit, what they were before the step)``. The cluster's own steps (a limit
  lowered, a tenant or deployment added, an agent reporting a limit above a cap) may take it over;
  the newest tick's evaluations sent before them are dropped (the tick computed its allowances on
  the cluster before the change), while older ticks' stay queued.
- **An evaluation message applies only the newest tick's allowance** (route 3): each tick opens a
  generation and publishes its allowances (budget/generations.py, as ``budget.tick`` does); its
  messages carry only ``(deployment, generation)`` and stay queued across later ticks, so they are
  run late (after the next tick), twice (a duplicate delivery), again after a 409 (a retry) and in
  any order, each through the task's path (``verdict`` when it runs, the fence before its writes).
  One whose tick is no longer the newest writes nothing. The real redis-server may also restart (a
  step: connections dropped, everything in it lost).
- **Over the limit, everyone above its minimum shrinks and is reported**: once every evaluation of a
  tick has run with nothing changed since, a rack still projected over its limit holds, once settled,
  no more than its limit while its minimums fit (tenants plus every listed deployment that may land on
  it at its minimum footprint); and when they do not fit, every listed deployment there above its
  minimum was written down that round and reports ``overBudgetWatts``. A rack with a deployment not
  admitted yet (nothing is scaled before admission, docs/budget.md) is not judged that round.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from powerfleet.budget.generations import Allocations, verdict
from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, parse_dgd
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.ports import Conflict
from powerfleet.twin.apiserver import ApiServer
from powerfleet.testing.budget.explore_world import CAP_W, DGD_KIND, DGD_V, NODES, World, admits, cap_of, terminating
from powerfleet.testing.budget.routes import MAX_SETTABLE_W, configs, fresh_enforced, pod_truth, tick_and_evaluate
from powerfleet.testing.budget.stand_in_operator import budget_status

RACKS = ("r1", "r2")
RESET = [("v1", "Pod"), (DGD_V, DGD_KIND), ("v1", "ConfigMap"), ("v1", "Node"),
         ("nvidia.com/v1alpha1", "DynamoGraphDeploymentScalingAdapter")]
STATS = {"examples": 0, "steps": 0, "rounds_judged": 0, "longest": 0, "writes": 0, "late": 0, "restarts": 0}
MAX_AGE_S = 60.0  # 2 x the budget interval: how old a tick's allowance may be when applied


def rack_nodes(rack: str) -> list[str]:
    return [n for n, g in NODES.items() if g == rack]


class Projection:
    """Each rack's watts: placed (every pod on its nodes) plus what may still land there (pods
    without a node its nodeSelector admits, replicas a DGD wants and has no pod for), and per
    deployment its part, to judge who shrinks."""

    def __init__(self, w: World) -> None:
        pods = w.pods()
        enforced = fresh_enforced(w.r, list(NODES), w.clock.now())
        self.watts: dict[str, int] = defaultdict(int)
        self.of: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # rack -> owner -> watts
        for p in pods:
            owner = (p["metadata"].get("labels") or {}).get(LABEL_DGD_NAME)
            owner = f"default/{owner}" if owner and p["metadata"]["namespace"] == "default" else "(tenants)"
            if w.kinds.get(owner, "ok") != "ok":
                owner = "(tenants)"  # a DGD whose inputs do not resolve is charged as a tenant
            where = p["spec"].get("nodeName")
            racks = {NODES[where]} if where else {g for g in RACKS if any(admits(p["spec"], n) for n in rack_nodes(g))}
            for g in racks - {None}:
                self.add(g, owner, pod_truth(p, enforced))
        self.desired_w: dict[str, int] = {}
        for key, kind in w.kinds.items():
            obj = w.api.get(DGD_V, DGD_KIND, key.split("/")[1])
            d = parse_dgd(obj)
            owner = key if kind == "ok" else "(tenants)"
            self.desired_w[key] = 0
            for c in d.components:
                raw = next(x for x in obj["spec"]["components"] if x["name"] == c.name)
                if "podTemplate" not in raw:
                    continue
                per_pod = cap_of(raw["podTemplate"]) or MAX_SETTABLE_W
                self.desired_w[key] += c.replicas * per_pod
                have = sum(1 for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_DGD_NAME) == d.name
                           and p["metadata"]["labels"].get(LABEL_COMPONENT) == c.name and not terminating(p))
                for g in RACKS:
                    if any(admits(raw["podTemplate"]["spec"], n) for n in rack_nodes(g)):
                        self.add(g, owner, max(0, c.replicas - have) * per_pod)

    def add(self, rack: str, owner: str, watts: int) -> None:
        self.watts[rack] += watts
        self.of[rack][owner] += watts


class BudgetMachine(RuleBasedStateMachine):
    redis_url = ""  # set by the caller (its own embedded server: the test's, the bench's)
    restart_redis: Any = None  # restarts that real redis-server (no persistence: everything in it is lost)
    api: ApiServer  # one server for the whole run, emptied for each example (``explore``)
    kube: KubeCluster

    def __init__(self) -> None:
        super().__init__()
        STATS["examples"] += 1
        self.steps = 0
        for api_version, kind in RESET:
            for obj in self.api.list(api_version, kind):
                self.api.delete(api_version, kind, obj["metadata"]["name"], obj["metadata"].get("namespace", ""))
        r = redis.Redis.from_url(self.redis_url)
        r.flushall()
        self.w = World(self.api, self.kube, r, FakeClock(t=1_800_000_000.0))
        self.w.setup()
        self.pending: list[tuple[str, int]] = []  # queued evaluation messages: (deployment, generation)
        self.newest = 0  # the latest tick's generation
        self.judged: dict[str, int] | None = None  # desired watts at the latest tick (None: no round to judge)
        self.conflict_next = False

    @initialize(racks=st.lists(st.sampled_from(["r1", "r2", None]), min_size=2, max_size=2),
                sizes=st.lists(st.tuples(st.integers(1, 2), st.integers(1, 4)), min_size=2, max_size=2))
    def two_deployments_running(self, racks: list[str | None], sizes: list[tuple[int, int]]) -> None:
        """Two listed deployments, running and admitted (a tick and its evaluations)."""
        for rack, (prefill, decode) in zip(racks, sizes, strict=True):
            self.w.add_deployment("ok", prefill, decode, rack)
        self.tick()
        self.evaluate_all(__import__("random").Random(0))
        self.w.operate_all()

    def teardown(self) -> None:
        STATS["longest"] = max(STATS["longest"], self.steps)

    # -- how a step is checked --

    def _safe(self, step: Any) -> None:
        """A step that is not the cluster's own doing: no rack goes over, or further over, its limit."""
        self.steps += 1
        STATS["steps"] += 1
        before = Projection(self.w).watts
        step()
        after = Projection(self.w)
        for g in RACKS:
            assert after.watts[g] <= max(self.w.limits[g], before[g]), (
                f"rack {g}: {before[g]} W -> {after.watts[g]} W on a limit of {self.w.limits[g]} W "
                f"({dict(after.of[g])})")

    def _cluster(self, step: Any) -> None:
        """The cluster's own change: it may take a rack over; the newest tick's evaluations, computed on
        the cluster before it, are dropped (older ticks' stay queued: they must be skipped)."""
        self.steps += 1
        STATS["steps"] += 1
        step()
        self.pending, self.judged = [m for m in self.pending if m[1] != self.newest], None

    def _round_done(self) -> bool:
        return not any(g == self.newest for _, g in self.pending)

    # -- the cluster's own changes --

    @precondition(lambda self: len(self.w.kinds) < 4)
    @rule(kind=st.sampled_from(["ok", "ok", "ok", "typo", "main"]), prefill=st.integers(1, 2),
          decode=st.integers(1, 3), rack=st.sampled_from(["r1", "r2", None]), placed=st.booleans())
    def add_deployment(self, kind: str, prefill: int, decode: int, rack: str | None, placed: bool) -> None:
        """``placed`` False: its pods are created and wait for a node (the scheduler binds them later)."""
        self._cluster(lambda: self.w.add_deployment(kind, prefill, decode, rack, placed))

    @precondition(lambda self: len(self.w.pods()) < 40)
    @rule(gpus=st.integers(1, 2), cap=st.sampled_from([None, "300", "500"]),
          where=st.sampled_from([None, *NODES]), rack=st.sampled_from([None, "r1", "r2"]))
    def add_tenant(self, gpus: int, cap: str | None, where: str | None, rack: str | None) -> None:
        self._cluster(lambda: self.w.add_tenant(gpus, cap, where, rack))

    @rule(rack=st.sampled_from(RACKS), watts=st.integers(2, 18).map(lambda k: k * 500))
    def set_limit(self, rack: str, watts: int) -> None:
        self._cluster(lambda: self.w.limits.__setitem__(rack, watts))

    @rule()
    def agents_clamp_up(self) -> None:
        """The agents report a cap below the device's minimum enforced at that minimum (400 W)."""
        self._cluster(lambda: self.w.agents_report(clamp=True))

    # -- everything else --

    @precondition(lambda self: bool(self.w.kinds))
    @rule(i=st.integers(0, 3), prefill=st.integers(1, 4), decode=st.integers(1, 8))
    def propose(self, i: int, prefill: int, decode: int) -> None:
        key = sorted(self.w.kinds)[i % len(self.w.kinds)]
        self._safe(lambda: self.w.state.propose(key, {"prefill": prefill, "decode": decode}, at=0, source="explore"))

    @rule()
    def tick(self) -> None:
        def run() -> None:
            self.w.clock.advance(30.0)
            self.w.agents_report()  # every live agent's pass (the caps it enforces: no watts added)
            allocations = Allocations(self.w.r)
            generation = allocations.open(self.w.clock.now())  # as budget.tick does
            plan = tick_and_evaluate(self.w.kube, self.w.state, self.w.r, configs({k: 20_000 for k in self.w.cfg}),
                                     self.w.limits, self.w.clock, evaluate=False).plan
            allocations.publish(generation, plan.limits)
            # the earlier ticks' messages stay queued (at most two ticks back: older ones are lost)
            self.pending = [m for m in self.pending if m[1] >= self.newest] + [(k, generation) for k in plan.limits]
            self.newest = generation
        self._safe(run)
        self.judged = Projection(self.w).desired_w
        if self._round_done():
            self._judge_round()

    @precondition(lambda self: bool(self.pending))
    @rule(i=st.integers(0, 11), again=st.booleans())
    def evaluate(self, i: int, again: bool) -> None:
        """One queued message, of the latest tick or an earlier one (late); ``again``: delivered twice."""
        key, generation = message = self.pending[i % len(self.pending)]
        conflict, self.conflict_next = self.conflict_next, False
        self._safe(lambda: self._evaluate(key, generation, conflict))
        if not conflict and not again:  # a 409 leaves it queued: the retry
            self.pending.remove(message)
        if self._round_done() and self.judged is not None:
            self._judge_round()

    def _evaluate(self, key: str, generation: int, conflict: bool) -> None:
        from powerfleet.budget.evidence import EvidenceSource, RedisReports
        from powerfleet.budget.persist import ConfigMapStatus
        from powerfleet.budget.program import DeploymentBudget
        from powerfleet.budget.runner import evaluate_deployment
        from powerfleet.cluster.budget_store import KubeBudgetStore
        from powerfleet.cluster.scaling import KubeScaling
        from powerfleet.testing.budget.routes import FRESH_S

        allocations = Allocations(self.w.r)
        gl = verdict(allocations.read(generation, key), self.w.clock.now(), MAX_AGE_S)
        if generation != self.newest:
            STATS["late"] += 1
            assert isinstance(gl, str), f"{key}: tick {generation}'s message applied after tick {self.newest}: {gl}"
        if isinstance(gl, str):
            return  # skipped, as the task records it (Outdated)
        kube = self.w.kube
        real = kube.patch_dgd_replicas
        if conflict:
            def refuse(*a: Any, **k: Any) -> Any:
                raise Conflict("409: the object has been modified", status=409)
            kube.patch_dgd_replicas = refuse  # type: ignore[method-assign]
        try:
            out = evaluate_deployment(kube, self.w.state, key, DeploymentBudget(power_limit_w=20_000), gl, self.w.clock,
                                ConfigMapStatus(KubeBudgetStore(kube)), KubeScaling(kube),
                                evidence=EvidenceSource(RedisReports(self.w.r, self.w.clock.now()), FRESH_S,
                                                        MAX_SETTABLE_W, "auto"),
                                fence=lambda: allocations.outdated(generation))
            STATS["writes"] = STATS.get("writes", 0) + bool(out.replicas_written)
        finally:
            kube.patch_dgd_replicas = real  # type: ignore[method-assign]

    @rule(order=st.randoms(use_true_random=False))
    def round(self, order: Any) -> None:
        """A tick and every evaluation it sends, in any order."""
        self.tick()
        self.evaluate_all(order)

    @rule(order=st.randoms(use_true_random=False), node_picks=st.lists(st.integers(0, 3), min_size=1, max_size=6))
    def round_and_rollout(self, order: Any, node_picks: list[int]) -> None:
        """A round, then the operator and the scheduler carry out what it wrote and the pods start."""
        self.round(order)
        self.operate_all()
        self.schedule_all(node_picks)
        self.start_all()
        self.operate_all()

    @precondition(lambda self: bool(self.pending))
    @rule(order=st.randoms(use_true_random=False))
    def evaluate_all(self, order: Any) -> None:
        """Every queued message, the late ones too, in any order (the control workers run them in parallel)."""
        messages = list(self.pending)
        order.shuffle(messages)
        for m in messages:
            if m in self.pending:
                self.evaluate(self.pending.index(m), False)

    @rule()
    def next_write_conflicts(self) -> None:
        self.conflict_next = True

    @precondition(lambda self: bool(self.w.kinds))
    @rule(i=st.integers(0, 3))
    def operate(self, i: int) -> None:
        key = sorted(self.w.kinds)[i % len(self.w.kinds)]
        self._safe(lambda: self.w.operate(key))

    @rule()
    def operate_all(self) -> None:
        self._safe(self.w.operate_all)

    @rule(pick=st.integers(0, 30), node_pick=st.integers(0, 3))
    def schedule(self, pick: int, node_pick: int) -> None:
        self._safe(lambda: self.w.schedule(pick, node_pick))

    @rule(node_picks=st.lists(st.integers(0, 3), min_size=1, max_size=6))
    def schedule_all(self, node_picks: list[int]) -> None:
        self._safe(lambda: self.w.schedule_all(node_picks))

    @rule(pick=st.integers(0, 30))
    def start_late(self, pick: int) -> None:
        self._safe(lambda: self.w.start(pick))

    @rule()
    def start_all(self) -> None:
        self._safe(self.w.start_all)

    @rule()
    def remove_terminating(self) -> None:
        self._safe(self.w.remove_terminating)

    @rule(n=st.sampled_from(list(NODES)))
    def agent_dies(self, n: str) -> None:
        self._safe(lambda: self.w.agent_dies(n))

    @rule(n=st.sampled_from(list(NODES)))
    def agent_returns(self, n: str) -> None:
        self._safe(lambda: self.w.dead_agents.discard(n))

    @rule()
    def flush_redis(self) -> None:
        self._safe(self.w.r.flushall)

    @precondition(lambda self: self.restart_redis is not None)
    @rule()
    def redis_restarts(self) -> None:
        """The real redis-server stops and starts again: every connection drops, its data is gone."""
        STATS["restarts"] += 1
        self._safe(self.restart_redis)

    # -- the round's judgement --

    def _judge_round(self) -> None:
        STATS["rounds_judged"] += 1
        before, self.judged = self.judged or {}, None
        now = Projection(self.w)
        for g in RACKS:
            if now.watts[g] <= self.w.limits[g]:
                continue
            listed = [k for k, watts in now.of[g].items() if k in self.w.kinds and watts > 0]
            status = {k: budget_status(self.api, k.split("/")[1]) for k in listed}
            if any(s.get("reason") in (None, "AwaitingSettlement") for s in status.values()):
                continue  # not admitted yet: nothing is scaled before admission
            minimum = sum(2 * CAP_W for _ in listed)  # one prefill and one decode of 1 GPU each
            if now.of[g].get("(tenants)", 0) + minimum <= self.w.limits[g]:
                settled = now.of[g].get("(tenants)", 0) + sum(min(now.desired_w[k], now.of[g][k]) for k in listed)
                assert settled <= self.w.limits[g], (
                    f"rack {g}: the minimums fit its limit of {self.w.limits[g]} W, yet once settled it holds "
                    f"{settled} W ({dict(now.of[g])}; desired {now.desired_w}; statuses {status})")
                continue
            for k in listed:
                if now.desired_w[k] > 2 * CAP_W:
                    assert now.desired_w[k] < before.get(k, 0) and status[k].get("overBudgetWatts", 0) > 0, (
                        f"rack {g} cannot hold its minimums ({dict(now.of[g])} on {self.w.limits[g]} W), "
                        f"yet {k} is not shrinking and reported: desired {before.get(k)} -> {now.desired_w[k]} W, "
                        f"status {status[k]}")


def explore(redis_url: str, *, examples: int, steps: int, seed: int, restart: Any = None) -> dict[str, int]:
    """Run the machine: ``examples`` runs of up to ``steps`` steps, seeded; raises the counterexample.
    ``restart``: restarts the redis-server at ``redis_url`` (a step; None: not explored)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as with_seed
    from hypothesis.stateful import run_state_machine_as_test

    STATS.update({"examples": 0, "steps": 0, "rounds_judged": 0, "longest": 0, "writes": 0, "late": 0, "restarts": 0})
    BudgetMachine.redis_url, BudgetMachine.restart_redis = redis_url, staticmethod(restart) if restart else None

    def factory() -> BudgetMachine:
        return BudgetMachine()
    with tempfile.TemporaryDirectory() as tmp, ApiServer() as api:
        BudgetMachine.api = api
        BudgetMachine.kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(Path(tmp) / "kc")))
        try:
            run_state_machine_as_test(with_seed(seed)(factory), settings=settings(
                max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck)))
        finally:
            BudgetMachine.kube.close()
    return dict(STATS)
