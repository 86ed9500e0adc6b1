"""End to end: an evaluation from an older tick that runs after a newer tick re-divided the rack
applies nothing (issue 29 item 2, issue 30 route 3). Real Redis, two real control worker
processes, the loopback API server holding one request to order them.

rack-a has 4,000 W; every replica is 1 GPU x 500 W. alpha and beta run (1 prefill, 1 decode) each.
Tick N: alpha is proposed decode 5 and is the only one that wants to grow: its share is 3,000 W.
Its evaluations (one batch, budget/batch.py) are held at the server (the batch's snapshot read)
while beta is proposed decode 5 too and tick N+1, on the other worker, re-divides the rack (2,000 W
each), and both scale to (1, 3): 4,000 W. Then the held batch goes on. Applying tick N's share would take alpha to (1, 5): 5,000 W on 4,000 W (what
the issue reproduced). It must write nothing and say why.
"""

from __future__ import annotations

import pytest

from powerfleet.testing.budget.stand_in_operator import replicas, settle
from tests.budget.conftest import RACK_A_NODES
from tests.budget.control import RACK_LIMIT_W as LIMIT_W, batch_results, call, rack_w, start_pair_on_rack

pytestmark = pytest.mark.integration


def test_an_evaluation_from_an_older_tick_applies_nothing(rack_a, launcher, app):
    api, kube, _ = rack_a
    start_pair_on_rack(rack_a, launcher, app, ["ctl1@gen", "ctl2@gen"])

    call(app, "propose", deployment="default/alpha", replicas={"decode": 5})
    held = api.faults.hold("GET", "/api/v1/configmaps")  # the batch's snapshot: only a batch lists them all
    tick_n = call(app, "tick")
    assert held.reached.wait(60), "tick N's evaluations never reached the server"

    call(app, "propose", deployment="default/beta", replicas={"decode": 5})
    tick_n1 = call(app, "tick")
    assert tick_n1["generation"] > tick_n["generation"], (tick_n, tick_n1)
    got = batch_results(app, tick_n1)
    assert {k: r["limit_w"] for k, r in got.items()} == {"default/alpha": 2000, "default/beta": 2000}, got
    assert replicas(api, "alpha") == replicas(api, "beta") == {"prefill": 1, "decode": 3}, got
    assert rack_w(api) <= LIMIT_W
    for name in ("alpha", "beta"):
        settle(api, kube, name, RACK_A_NODES)

    held.release()  # tick N's evaluations go on, after tick N+1 re-divided the rack
    late = batch_results(app, tick_n)
    for key in ("default/alpha", "default/beta"):
        assert late[key]["reason"] == "Outdated" and late[key]["replicas_written"] == {}, late
        assert f"generation {tick_n['generation']}" in late[key]["skipped"] and "later tick" in late[key]["skipped"], late
    assert replicas(api, "alpha") == {"prefill": 1, "decode": 3}, late
    assert rack_w(api) <= LIMIT_W, (replicas(api, "alpha"), replicas(api, "beta"))

    # The same message sent again (a duplicate, a retry, by hand) applies nothing; a generation no
    # tick opened is no allowance either; the current one is the tick's own allowance, read from Redis.
    dup = call(app, "evaluate", deployment="default/alpha", generation=tick_n["generation"])
    assert dup["reason"] == "Outdated" and dup["replicas_written"] == {}, dup
    forged = call(app, "evaluate", deployment="default/alpha", generation=tick_n1["generation"] + 10**9)
    assert forged["reason"] == "Outdated" and "never opened" in forged["skipped"], forged
    current = call(app, "evaluate", deployment="default/alpha", generation=tick_n1["generation"])
    assert current["limit_w"] == 2000 and current["reason"] == "Planned", current
    assert rack_w(api) <= LIMIT_W, (replicas(api, "alpha"), replicas(api, "beta"))
