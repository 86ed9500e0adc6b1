"""Admission wired into the ledger (issue 22 item 4): the budget tick lets an oversubscribed group's
deployments share ratio x limit while the group admits, and holds them at the cap-sum ledger's
budget while it does not (power/admission.py, through budget/tick.py's ``oversubscription`` seam).

rack-a: limit 2,000 W, oversubscription 1.5 (3,000 W of requested caps), nodes gpu-a1 and gpu-a2;
deployment alpha: 1 prefill + 3 decode, 1 GPU x 500 W per replica (2,000 W: at the limit),
proposed decode 6 (3,500 W)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from powerfleet.budget.state import BudgetState
from powerfleet.budget.tick import tick_limits
from powerfleet.cluster.gpu_pods import KubeGpuPods
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config.fleet import DeploymentBudgetConfig
from powerfleet.power.admission import AdmissionRule
from powerfleet.power.telemetry import publish_telemetry
from powerfleet.testing.waiting import wait_for
from tests.budget.conftest import RACK_A_NODES, rack_a  # noqa: F401 - fixture
from powerfleet.testing.budget.stand_in_operator import budget_status, dgd, replicas, settle
from tests.integration.conftest import app, broker_url, fleet_env, launcher, redis_server, wait_worker  # noqa: F401
from tests.power.test_admission import StoredPower

LIMIT_W, RATIO = 2000, 1.5
KEY = "default/alpha"


def alpha(api, kube: KubeCluster, state: BudgetState) -> None:  # type: ignore[no-untyped-def]
    api.apply(dgd("alpha", 1, 3))
    settle(api, kube, "alpha", RACK_A_NODES)
    state.propose(KEY, {"decode": 6}, at=0, source="test")


def test_the_tick_shares_ratio_times_the_limit_only_while_the_group_admits(rack_a, broker_url) -> None:  # noqa: F811
    api, kube, _ = rack_a
    state = BudgetState(redis.Redis.from_url(broker_url))
    alpha(api, kube, state)
    cfg = {KEY: DeploymentBudgetConfig(power_limit_w=10_000)}
    now = 1000.0
    fresh = StoredPower({"rack-a": [(now - k, 1000.0) for k in range(30)]}, {"rack-a": 0.4})
    quiet = StoredPower({}, {"rack-a": 0.4})

    def plan(power):  # type: ignore[no-untyped-def]
        rule = AdmissionRule({"rack-a": RATIO}, power, window_s=300.0, reserve_fraction=0.05, stale_s=2.0)
        return tick_limits(kube, state, cfg, {"rack-a": LIMIT_W}, "powerfleet.io/rack", KubeGpuPods(kube), now=now,
                           oversubscription=rule)

    plain = tick_limits(kube, state, cfg, {"rack-a": LIMIT_W}, "powerfleet.io/rack", KubeGpuPods(kube), now=now)
    assert plain.limits[KEY].limit_w == 2000 and plain.group_admission == {}
    opened = plan(fresh)
    assert opened.limits[KEY].limit_w == 3000 and opened.group_admission["rack-a"].admission.admitted
    assert opened.group_current == {"rack-a": 2000} and opened.group_peak_bound == {"rack-a": 3000}
    closed = plan(quiet)
    assert closed.limits[KEY].limit_w == 2000 and closed.group_admission["rack-a"].admission.reason == "telemetry_stale"
    assert closed.group_peak_bound == {"rack-a": 2000}
    # the deployment's evaluation is told why (its status message says it), only while it is closed
    assert closed.limits[KEY].admission == closed.group_admission["rack-a"].admission.message
    assert opened.limits[KEY].admission is None and plain.limits[KEY].admission is None


def publish(r: redis.Redis, at: float) -> None:
    """Two GPUs per node drawing 250 W each under 500 W caps (floor 200 W): as the agents publish."""
    for node in RACK_A_NODES:
        publish_telemetry(r, node, {f"GPU-{node}-{i}": {"pod_uid": f"{node}-{i}", "requested_w": 500, "min_w": 200,
                                                         "max_w": 700, "draw_w": 250.0, "at": at} for i in range(2)},
                          ttl_s=600)


@pytest.mark.integration
def test_a_stale_group_holds_a_scale_up_and_a_fresh_one_admits_up_to_the_ratio(rack_a, launcher, app, broker_url) -> None:  # noqa: F811
    api, kube, kubeconfig = rack_a
    r = redis.Redis.from_url(broker_url)
    alpha(api, kube, BudgetState(r))
    launcher.env.update({
        "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
        "POWERFLEET_BUDGET__GROUPS": json.dumps({"rack-a": {"limit_w": LIMIT_W, "oversubscription": RATIO}}),
        "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({KEY: {"power_limit_w": 10_000, "priority": "low"}}),
        # a long period, so a figure the guard measured stays fresh (two periods) until the tick reads it
        "POWERFLEET_POWER__GUARD_PERIOD_S": "30",
        # Admission alone: these reports name no real pod, so the budget's enforcement evidence
        # (budget.enforcement_evidence, tests/budget/test_evidence_end_to_end.py) would hold every
        # scale-up as unproven and charge the GPUs at their maximum.
        "POWERFLEET_BUDGET__ENFORCEMENT_EVIDENCE": "off",
    })
    launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@oversub", "--concurrency", "1")
    wait_worker(app, "ctl@oversub")

    def call(task: str, **kwargs):  # type: ignore[no-untyped-def]
        return app.send_task(task, kwargs=kwargs).get(timeout=60)

    # The agents' reports are old: the guard counts every GPU at its safe cap and records no measured figure.
    publish(r, at=time.time() - 1000)
    assert call("powerfleet.power.guard", group="rack-a")["stale"]
    tick = call("powerfleet.budget.tick")
    assert tick["admission"] == {"rack-a": "telemetry_stale"}
    st = wait_for(lambda: (s := budget_status(api, "alpha")).get("powerLimitWatts") and s, "alpha evaluated")
    assert st["powerLimitWatts"] == LIMIT_W and replicas(api, "alpha") == {"prefill": 1, "decode": 3}
    assert "admission closed: group 'rack-a'" in st["message"], st["message"]

    # Fresh reports: 1,000 W measured, p99 + 5 % reserve well within 2,000 W: 1.5 x 2,000 W to share.
    publish(r, at=time.time())
    assert call("powerfleet.power.guard", group="rack-a")["stale"] == []
    tick = call("powerfleet.budget.tick")
    assert tick["admission"] == {"rack-a": "admitted"}
    st = wait_for(lambda: (s := budget_status(api, "alpha")).get("powerLimitWatts") == 3000 and s,
                  "alpha planned against 1.5 x the limit")
    wait_for(lambda: replicas(api, "alpha") == {"prefill": 1, "decode": 5}, "decode scaled up to the ratio")
    assert st["targets"] == {"decode": 5}  # 6 x 500 W = 3,000 W: the 7th replica would pass 1.5 x 2,000 W
    assert "admission closed" not in st["message"], st["message"]
