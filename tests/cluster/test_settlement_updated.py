"""Planted-bug guard: a component with fewer updated replicas than desired is not settled."""

from __future__ import annotations

from powerfleet.cluster.dgd import parse_dgd
from powerfleet.cluster.settlement import SettlementState, settle
from tests.cluster.builders import disagg
from tests.cluster.test_settlement import done, pods


def test_updated_replicas_below_replicas_is_still_rolling() -> None:
    # Every replica ready, but one of the two prefill pods still runs the old template.
    status = done(prefill={"replicas": 2, "readyReplicas": 2, "updatedReplicas": 1})
    s = settle(parse_dgd(disagg(status=status)), pods())
    assert s.state is SettlementState.PENDING
    assert "component 'prefill': 1 of 2 replicas updated" in s.reasons


def test_updated_replicas_equal_to_replicas_settles() -> None:
    assert settle(parse_dgd(disagg(status=done())), pods()).settled
