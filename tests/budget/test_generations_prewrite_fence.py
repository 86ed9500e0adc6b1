"""End to end: the pre-write generation fence (budget/runner.py, asked just before an evaluation
writes). A batch evaluates its deployments one after another on one snapshot, so a newer tick can
open between the first deployment's write and the second's; the second then writes nothing, even
though its DGD is unchanged (its resourceVersion fence would let the write through). Real Redis,
two real control worker processes, the loopback API server holding two requests to order them.

The rack as in test_generations_end_to_end.py: 4,000 W, 500 W a replica, alpha and beta at (1, 1).
Tick N: alpha is proposed decode 2 and beta decode 3; 2,000 W are free, so alpha may reach 1,500 W
and beta 2,000 W. Tick N's batch (alpha, then beta) is held at the server in alpha's replica PATCH.
Meanwhile beta's proposal drops back to decode 1 and alpha's rises to decode 5, and tick N+1 (the
other worker) gives alpha all 2,000 free watts: alpha (1, 5), 3,000 W; beta's replicas are left as
they are, and its batch is held in beta's condition PATCH (the one write it makes to beta's DGD), so
beta's DGD keeps the resourceVersion tick N's batch read. Then tick N's held PATCH goes on (it
conflicts: alpha changed since it was read) and beta's turn comes with tick N's allowance and the
batch's proposal (decode 3): applying it would take the rack to 5,000 W on 4,000 W. It must write
nothing and say why.
"""

from __future__ import annotations

import pytest

from powerfleet.testing.budget.stand_in_operator import replicas
from tests.budget.control import RACK_LIMIT_W, batch_results, call, rack_w, start_pair_on_rack

pytestmark = pytest.mark.integration


def test_a_batch_stops_writing_once_a_newer_tick_opens_between_its_deployments(rack_a, launcher, app):
    api = rack_a[0]
    # Tick N's allowance must still be fresh when beta's turn comes (two budget intervals): only the
    # fence, not the age check, may stop it on a loaded machine.
    launcher.env["POWERFLEET_BEAT__BUDGET_INTERVAL_S"] = "600"
    start_pair_on_rack(rack_a, launcher, app, ["ctl1@fence", "ctl2@fence"])

    call(app, "propose", deployment="default/alpha", replicas={"decode": 2})
    call(app, "propose", deployment="default/beta", replicas={"decode": 3})
    held = api.faults.hold("PATCH", "/dynamographdeployments/alpha")  # alpha's replica write, tick N's
    tick_n = call(app, "tick")
    assert tick_n["evaluations"] == ["default/alpha", "default/beta"], tick_n
    assert len(set(tick_n["task_ids"].values())) == 1, tick_n  # one batch: beta is evaluated after alpha
    assert held.reached.wait(60), "tick N's batch never wrote alpha's replicas"

    # While alpha's write is held: the batch has read its proposals (beta: decode 3) and its allowances.
    call(app, "propose", deployment="default/beta", replicas={"decode": 1})
    call(app, "propose", deployment="default/alpha", replicas={"decode": 5})
    # Tick N+1's batch writes beta's condition (its first evaluation): held, so beta's DGD is as
    # tick N's batch read it when beta's turn comes, and only the generation fence can stop it.
    condition = api.faults.hold("PATCH", "/dynamographdeployments/beta/status")
    tick_n1 = call(app, "tick")
    assert tick_n1["generation"] > tick_n["generation"], (tick_n, tick_n1)
    assert condition.reached.wait(60), "tick N+1's batch never reached beta"
    assert replicas(api, "alpha") == {"prefill": 1, "decode": 5}  # tick N+1 gave alpha the free 2,000 W
    assert replicas(api, "beta") == {"prefill": 1, "decode": 1}
    assert rack_w(api) == RACK_LIMIT_W

    held.release()  # tick N's batch goes on: alpha's write (past its fence already), then beta's turn
    # alpha's own outcome is not asked for: a held write past the client's timeout is resent on its own
    late = app.AsyncResult(tick_n["task_ids"]["default/beta"]).get(timeout=90)["results"]["default/beta"]
    assert rack_w(api) <= RACK_LIMIT_W, (replicas(api, "alpha"), replicas(api, "beta"), late)
    assert replicas(api, "beta") == {"prefill": 1, "decode": 1}, late
    assert late["reason"] == "Outdated" and late["replicas_written"] == {}, late
    assert f"generation {tick_n['generation']}" in late["skipped"] and "later tick" in late["skipped"], late

    condition.release()
    got = batch_results(app, tick_n1)
    assert got["default/alpha"]["limit_w"] == 3000 and got["default/beta"]["replicas_written"] == {}, got
    assert replicas(api, "alpha") == {"prefill": 1, "decode": 5}, got
    assert rack_w(api) <= RACK_LIMIT_W, (replicas(api, "alpha"), replicas(api, "beta"))
