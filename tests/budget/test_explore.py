"""The seeded exploration of the budget's state space, bounded for ``make test`` (issue 30 item 3;
tests/budget/explore_machine.py has the steps and invariants; bench/budget_explore.py runs it longer)."""

from __future__ import annotations

from tests.budget.explore_machine import explore


def test_no_route_over_a_racks_limit_in_a_seeded_exploration(broker_url):
    stats = explore(broker_url, examples=10, steps=40, seed=30)  # a counterexample raises inside explore
    # it explored: rounds were judged and replicas written, not only steps taken
    assert stats["rounds_judged"] >= 10 and stats["writes"] >= 3 and stats["late"] >= 3, stats
