"""The load signal: replicas = max(1, ceil(load / target per replica))."""

from __future__ import annotations

import math

import pytest

from powerfleet.budget.load import replicas_for_load


def test_formula():
    assert replicas_for_load({"decode": 42.0, "prefill": 0.0}, {"decode": 8.0, "prefill": 5.0}) == {"decode": 6, "prefill": 1}
    assert replicas_for_load({"worker": 16.0}, {"worker": 8.0}) == {"worker": 2}


@pytest.mark.parametrize(("load", "target", "match"), [
    ({"decode": 1.0}, {}, "target_per_replica.decode: missing"),
    ({"decode": -1.0}, {"decode": 1.0}, "load.decode"),
    ({"decode": math.inf}, {"decode": 1.0}, "load.decode"),
    ({"decode": 1.0}, {"decode": 0.0}, "target_per_replica.decode"),
    # Each finite, their ratio not: an OverflowError before it was bounded.
    ({"decode": 1e300}, {"decode": 1e-300}, "over 100000"),
    ({"decode": 1e6}, {"decode": 1.0}, "over 100000"),
])
def test_bad_signals(load, target, match):
    with pytest.raises(ValueError, match=match):
        replicas_for_load(load, target)
