"""A scenario's events (twin/demo/scenario_events.py) against a real twin, the fleet behind a recording
port: a capability this build lacks is a failed event with its reason, a refused send fails only
its event, and each event holds only on what the twin shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from powerfleet.twin.runtime import Twin, TwinOptions
from powerfleet.twin.demo.scenario_events import ScenarioRun
from powerfleet.twin.demo.scenario_load import load, parse
from powerfleet.twin.demo.scenario_twin import resized, twin_parts


class Fleet:
    """The fleet port, recording; ``tasks`` are the tasks this build has."""

    def __init__(self, tasks: set[str], refuse: bool = False) -> None:
        self.tasks, self.refuse = tasks, refuse
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[tuple[str, Any]] = []

    def send(self, name: str, kwargs: dict[str, Any]) -> None:
        if self.refuse:
            raise ValueError(f"{name}: deployment: bad shape")
        self.sent.append((name, kwargs))

    def has_task(self, name: str) -> bool:
        return name in self.tasks

    def set_limit(self, rack: str, watts: int) -> None:
        self.calls.append(("set_limit", (rack, watts)))

    def group_limit(self, rack: str) -> float | None:
        return None

    def planning_limit(self, rack: str) -> float | None:
        return 500.0

    def kill_agent(self, node: str) -> int:
        self.calls.append(("kill_agent", node))
        return -9

    def restart_agent(self, node: str) -> None:
        self.calls.append(("restart_agent", node))

    def agent_answers(self, node: str) -> bool:
        return False

    def flush_redis(self) -> None:
        self.calls.append(("flush_redis", None))

    answering = (0, 3)  # (workers answering now, before the kill)

    def kill_broker(self) -> int:
        self.calls.append(("kill_broker", None))
        return -9

    def start_broker(self) -> None:
        self.calls.append(("start_broker", None))

    def workers_answering(self) -> tuple[int, int]:
        return self.answering


def _twin(tmp_path: Path, scenario: Any, file: Path) -> Twin:
    parts = twin_parts(scenario, file)
    return Twin(TwinOptions(spec=parts.spec, root=tmp_path / "twin", window_s=10, manifests=parts.manifests,
                            tenant_pods=parts.tenant_pods, tenant_load=parts.tenant_load,
                            rack_limit_w=parts.rack_limit_w, traffic=parts.traffic)).start()


# The default demo's cap change and manual router change, and a rebalance far above the budget.
EVENTS = [
    {"at": "8%", "kind": "set_annotation", "name": "cap_change", "deployment": "llm-disagg", "component": "decode",
     "watts": 380},
    {"at": "15%", "kind": "propose_load", "name": "follow_load", "deployment": "llm-agg",
     "target_per_replica": {"worker": 8000}},
    {"at": "25%", "kind": "propose", "name": "scale_up_clamped", "deployment": "llm-disagg", "readmit": True,
     "expect": "clamped", "replicas": {"prefill": 1, "decode": 18}},
    {"at": "60%", "kind": "patch_router", "name": "manual_change_reverted", "deployment": "llm-agg",
     "policy": {"temperature": 0.9}, "after_retune_applied": True, "expect": "reverted"},
]


@pytest.fixture
def default(tmp_path: Path):
    scenario, file = load("default")
    scenario = parse(yaml.safe_dump({**resized(scenario, 1).model_dump(mode="json", exclude_none=True),
                                     "events": EVENTS}), "t")
    tw = _twin(tmp_path, scenario, file)
    yield scenario, tw
    tw.stop()


def test_absent_tasks_fail_their_events_with_the_reason(default) -> None:
    scenario, twin = default
    fleet, log = Fleet(set()), []
    run = ScenarioRun(scenario, twin, fleet, log.append)
    run.tick(1.0)
    run.finish()
    states = run.states()
    assert states["scale_up_clamped"] == "failed: powerfleet.budget.propose is not a task in this build", states
    assert states["manual_change_reverted"] == "failed: powerfleet.retune.apply is not a task in this build", states
    assert states["follow_load"] == "failed: powerfleet.budget.propose_load is not a task in this build", states
    assert not fleet.sent  # nothing was sent for a capability that is not there
    # The cap change needs no task: it was made on the DGD, and without agents it cannot hold.
    assert states["cap_change"].startswith("failed: not reached before the end"), states
    dgd = twin.api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "llm-disagg")
    assert dgd["spec"]["services"]["decode"]["extraPodMetadata"]["annotations"][
        "dynamo.nvidia.com/gpu-power-limit"] == "380"
    started = run.steps[0].outcome.started_at
    assert started is not None and run.steps[0].outcome.held_at is None


def test_a_refused_send_fails_only_its_event(default) -> None:
    scenario, twin = default
    run = ScenarioRun(scenario, twin, Fleet({"powerfleet.budget.propose", "powerfleet.budget.readmit"}, refuse=True),
                      lambda line: None)
    run.tick(0.3)
    states = run.states()
    assert states["scale_up_clamped"].startswith("failed: ValueError: powerfleet.budget.readmit: deployment: bad"), \
        states
    assert states["cap_change"] == "running" and states["manual_change_reverted"] == "pending", states
    assert states["follow_load"].startswith("failed: "), states  # propose_load is not a task here


def test_the_propose_event_reads_the_budgets_reasons_from_its_status_configmap(default) -> None:
    from powerfleet.cluster.budget_store import KubeBudgetStore, Owner
    from powerfleet.cluster.kube import KubeCluster

    scenario, twin = default
    fleet = Fleet({"powerfleet.budget.propose", "powerfleet.budget.readmit"})
    run = ScenarioRun(scenario, twin, fleet, lambda line: None)
    scale = next(s for s in run.steps if s.name == "scale_up_clamped")
    assert scale.start() is None and run.budget_status("llm-disagg") == {}  # nothing written yet
    assert [n for n, _ in fleet.sent] == ["powerfleet.budget.readmit", "powerfleet.budget.propose"], fleet.sent
    assert fleet.sent[1][1] == {"deployment": "default/llm-disagg", "replicas": {"prefill": 1, "decode": 18}}
    kube = KubeCluster.from_kubeconfig(str(twin.kubeconfig))
    try:
        dgd = twin.api.get("nvidia.com/v1beta1", "DynamoGraphDeployment", "llm-disagg", twin.spec.namespace)
        written = {"ready": "True", "reason": "Planned", "reasons": ["power_budget_clamped", "power_rebalance_staged"]}
        KubeBudgetStore(kube).write_status(Owner.of(dgd), written, None)
    finally:
        kube.close()
    assert run.budget_status("llm-disagg") == written
    holds, seen = scale.poll()
    assert not holds, seen  # decode has not grown
    assert "planner reasons seen ['power_budget_clamped', 'power_rebalance_staged']; staged" in seen, seen


def test_a_pending_tenant_is_scheduled_once_another_tenants_pod_is_gone(tmp_path: Path) -> None:
    scenario, file = load("tenant-pending")
    scenario = parse(yaml.safe_dump({**scenario.model_dump(mode="json", exclude_none=True),
                                     "tenants": [{"name": "batch-a", "node": "twin-gpu-01", "gpus": 6,
                                                  "power_w": 300, "grace_s": 0}]}), "t")
    twin = _twin(tmp_path, scenario, file)
    try:
        fleet = Fleet(set())
        run = ScenarioRun(scenario, twin, fleet, lambda line: None)
        arrive, delete = run.steps
        from tests.waiting import wait_for

        wait_for(lambda: len([p for p in twin.api.list("v1", "Pod") if p["spec"].get("nodeName")]) >= 9,
                 "the DGDs' pods to be placed")
        assert arrive.start() is None
        holds, seen = arrive.poll()
        assert not holds and seen == "Pending (Unschedulable)", seen
        assert delete.start() is None
        wait_for(lambda: delete.poll()[0], "batch-a to be gone")
        wait_for(lambda: arrive.poll()[0], "train-b to be scheduled")
        pod = twin.api.get("v1", "Pod", "train-b")
        assert pod["spec"]["nodeName"] == "twin-gpu-01", pod
        assert len(pod["metadata"]["annotations"]["twin.powerfleet.io/gpus"].split(",")) == 6, pod
        wait_for(lambda: any(g.pod == "train-b" and g.draw_w > 0 for g in twin.snapshot_samples()[-1].gpus),
                 "train-b to draw power")
    finally:
        twin.stop()


def test_set_limit_moves_the_twins_budget_and_tells_the_fleet(tmp_path: Path) -> None:
    scenario, file = load("limit-below-minimums")
    twin = _twin(tmp_path, scenario, file)
    try:
        fleet = Fleet(set())
        run = ScenarioRun(scenario, twin, fleet, lambda line: None)
        assert twin.budgets == {"rack-a": 9000.0}
        run.tick(0.31)
        assert twin.budgets == {"rack-a": 1200.0} and fleet.calls == [("set_limit", ("rack-a", 1200))]
        assert run.states()["limit-drops"] == "running"  # until a budget tick plans with it
        from tests.waiting import wait_for

        wait_for(lambda: any(s.rack_budget_w == {"rack-a": 1200.0} for s in twin.snapshot_samples()),
                 "a sample taken under the new limit")
    finally:
        twin.stop()


def test_propose_load_proposes_from_the_served_token_rates(default) -> None:
    scenario, twin = default
    fleet = Fleet({"powerfleet.budget.propose_load"})
    run = ScenarioRun(scenario, twin, fleet, lambda line: None)
    from tests.waiting import wait_for

    wait_for(lambda: twin.token_rates("llm-agg")[0] > 0, "llm-agg to serve traffic")
    run.tick(0.0)  # records the served rates
    step = next(s for s in run.steps if s.name == "follow_load")
    assert step.start() is None
    (name, kwargs), = fleet.sent
    assert name == "powerfleet.budget.propose_load" and kwargs["deployment"] == "default/llm-agg", kwargs
    assert kwargs["target_per_replica"] == {"worker": 8000.0} and kwargs["load"]["worker"] > 0, kwargs


def test_kill_broker_starts_it_again_and_holds_once_every_worker_answers_again(default) -> None:
    scenario, twin = default
    plan = parse(yaml.safe_dump({**scenario.model_dump(mode="json", exclude_none=True),
                                 "events": [{"at": "50%", "kind": "kill_broker", "name": "broker", "down_s": 0}]}), "t")
    fleet = Fleet(set())
    run = ScenarioRun(plan, twin, fleet, lambda line: None)
    run.tick(0.4)
    assert fleet.calls == [] and run.states()["broker"] == "pending"
    run.tick(0.5)  # killed, down for 0 s: started again on the same poll; two of three workers are back
    fleet.answering = (2, 3)
    run.tick(0.55)
    assert fleet.calls == [("kill_broker", None), ("start_broker", None)], fleet.calls
    assert run.states()["broker"] == "running", run.steps[0].outcome
    fleet.answering = (3, 3)
    run.tick(0.6)
    outcome = run.steps[0].outcome
    assert outcome.state == "ok" and "redis-server exited -9, back on its port" in outcome.detail, outcome
    assert "3 of the 3 workers that answered before answer a ping" in outcome.detail, outcome
    assert fleet.calls.count(("start_broker", None)) == 1, fleet.calls


def test_a_manual_router_change_that_races_a_retune_write_reads_again_and_lands(default) -> None:
    """Seen in CI: retune's apply moved the revision between the scenario's GET and its PATCH (409)."""
    scenario, twin = default
    plan = parse(yaml.safe_dump({**scenario.model_dump(mode="json", exclude_none=True), "events": [
        {"at": "10%", "kind": "patch_router", "name": "by_hand", "deployment": "llm-agg",
         "policy": {"temperature": 0.9}}]}), "t")
    from tests.waiting import wait_for

    fe = wait_for(lambda: next((f for f in twin.frontends.values() if f.dgd == "llm-agg"), None),
                  "llm-agg's frontend to run")
    router, read = fe.router, fe.router.snapshot
    raced: list[int] = []

    def snapshot_then_a_retune_write() -> dict[str, Any]:
        seen = read()
        if not raced:  # once: the write lands after the GET was answered, before the PATCH
            raced.append(router.patch(json.dumps({"revision": seen["revision"],
                                                  "policy": {"prefill_load_scale": 2}}).encode(), "retune")[0])
        return seen

    router.snapshot = snapshot_then_a_retune_write
    run = ScenarioRun(plan, twin, Fleet(set()), lambda line: None)
    run.tick(0.1)
    run.tick(0.2)
    assert raced == [200]
    assert [w.status for w in router.writes] == [200, 409, 200], router.writes
    assert run.states()["by_hand"] == "ok", run.steps[0].outcome
    assert router.policy.temperature == 0.9 and router.policy.prefill_load_scale == 2
