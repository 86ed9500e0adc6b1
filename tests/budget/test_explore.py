"""The seeded exploration of the budget's state space, bounded for ``make test`` (issue 30 item 3;
src/powerfleet/testing/budget/explore_machine.py has the steps and invariants; bench/budget_explore.py runs it longer)."""

from __future__ import annotations

from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.testing.budget.explore_machine import explore


def test_no_route_over_a_racks_limit_in_a_seeded_exploration():
    with EmbeddedRedis() as server:  # its own: a step restarts it
        stats = explore(server.url, examples=10, steps=40, seed=30, restart=server.restart)  # a counterexample raises
    # it explored: rounds were judged, replicas written, late messages run and Redis restarted
    assert stats["rounds_judged"] >= 10 and stats["writes"] >= 3 and stats["late"] >= 3, stats
    assert stats["restarts"] >= 1, stats
