"""End to end: the budget tick and its evaluations through a loopback server that answers a share
of every request 429 (with Retry-After) or 5xx (issue 30 item 2). Real Redis, a real control
worker. The reads retry (cluster/retries.py; urllib3 waits out a 429's Retry-After), an
evaluation whose write or status read fails transiently is retried by Celery, and a tick whose
reads still fail sends nothing; whatever happens, rack-a never goes over its limit and the
clamped, staged scale-up of tests/budget/test_end_to_end.py still lands.
"""

from __future__ import annotations

import pytest

from tests.budget.conftest import RACK_A_NODES
from tests.budget.control import start_control
from powerfleet.testing.budget.stand_in_operator import dgd, replicas, settle

pytestmark = pytest.mark.integration
LIMIT_W, REPLICA_W = 4000, 500


def test_the_budget_keeps_the_rack_through_429s_and_5xx(rack_a, launcher, app):
    api, kube, kubeconfig = rack_a
    api.apply(dgd("alpha", 1, 3))
    api.apply(dgd("beta", 1, 1))
    for name in ("alpha", "beta"):
        settle(api, kube, name, RACK_A_NODES)
    start_control(launcher, app, kubeconfig, {"rack-a": LIMIT_W}, {"default/alpha": 4000, "default/beta": 4000},
                  ["ctl@faults"])
    app.send_task("powerfleet.budget.propose", kwargs={"deployment": "default/alpha",
                                                       "replicas": {"prefill": 6, "decode": 1}}).get(timeout=60)
    faulty = {"throttle": 0.12, "error": 0.08, "retry_after_s": 1}
    api.faults.rates(**faulty, seed=30)
    outcomes: list = []
    for _ in range(12):
        tick = app.send_task("powerfleet.budget.tick").get(timeout=120)
        for task_id in set(tick["task_ids"].values()):
            r = app.AsyncResult(task_id)
            r.get(timeout=120, propagate=False)  # the batch sends a deployment that met a 5xx again alone
            outcomes.append(r.result if r.successful() else f"{r.state}: {r.result!r}")
        api.faults.rates()  # the stand-in operator's own writes go through
        for name in ("alpha", "beta"):
            settle(api, kube, name, RACK_A_NODES)
        api.faults.rates(**faulty)
        rack = sum(n * REPLICA_W for name in ("alpha", "beta") for n in replicas(api, name).values())
        assert rack <= LIMIT_W, (rack, replicas(api, "alpha"), replicas(api, "beta"), outcomes[-2:])
        if replicas(api, "alpha") == {"prefill": 5, "decode": 1}:
            break
    assert replicas(api, "alpha") == {"prefill": 5, "decode": 1}, outcomes
    assert replicas(api, "beta") == {"prefill": 1, "decode": 1}, outcomes
    served = dict(api.faults.served)
    assert served.get(429, 0) > 0 and sum(n for c, n in served.items() if c >= 500) > 0, served
