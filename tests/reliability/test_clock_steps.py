"""The wall clock stepping backwards and forwards (NTP correction, a VM resumed, a bad RTC).

Retune windows are pure functions of epoch time, launched under a Redis ``SET NX`` per
(deployment, window) and a "last launched" mark, and decided at most once (the state Lease's
``last_window``): a backward step repeats nothing, a forward step launches only the newest
closed window (docs/retune.md: missed windows are skipped, not replayed). Leases are judged on
the monotonic clock: a wall-clock jump neither expires another holder's Lease nor loses one's own.
Real Redis and the loopback API server (official client); time is a FakeClock with separate wall
and monotonic readings.
"""

from __future__ import annotations

import pytest

from powerfleet.clock import FakeClock
from powerfleet.retune import control
from powerfleet.retune.context import Deployment
from powerfleet.retune.leadership import Fenced
from powerfleet.retune.windows import dedupe_key
from powerfleet.testing.retune_world import BASE_K, start_of
from tests.retune.conftest import Outbox, make_ports, retune_config

pytestmark = pytest.mark.integration
K = BASE_K
DAY = 86400.0


def test_backward_and_forward_steps_neither_lose_nor_repeat_a_window(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    clock = FakeClock(t=start_of(K) + 1, mono=5000.0)
    outbox = Outbox()
    ports = make_ports(redis_url, kube, "ctl@steps", clock, outbox)
    ports.r.flushall()

    def tick_at(wall: float) -> dict:
        clock.t = wall
        clock.mono += 7  # monotonic time only ever moves forward, whatever the wall clock does
        row = control.tick(cfg, ports, wall)[0]
        assert row["status"] == "leader", row
        return row

    assert tick_at(start_of(K) + 1)["launched"] == []  # enabled in window K: K is skipped
    assert tick_at(start_of(K + 2) + 1)["launched"] == [K + 1]
    # Backwards by two windows, then creeping forward again through the same instants.
    for wall in (start_of(K) + 30, start_of(K + 1) + 1, start_of(K + 2) + 1, start_of(K + 2) + 40):
        assert tick_at(wall)["launched"] == [], wall
    # Forwards by an hour: only the newest closed window is launched, once.
    assert tick_at(start_of(K + 62) + 1)["launched"] == [K + 61]
    assert tick_at(start_of(K + 62) + 2)["launched"] == []
    # And back again past windows that were skipped: none of them is launched late.
    for wall in (start_of(K + 3) + 1, start_of(K + 30) + 1):
        assert tick_at(wall)["launched"] == [], wall
    assert tick_at(start_of(K + 63) + 1)["launched"] == [K + 62]
    sent = [kw["window"] for kw in outbox.of(control.WINDOW_TASK)]
    assert sent == [K + 1, K + 61, K + 62]  # each launched exactly once, in order
    assert all(ports.r.exists(dedupe_key("llama", k)) for k in sent)
    assert not any(ports.r.exists(dedupe_key("llama", k)) for k in (K, K + 2, K + 30, K + 60))


def test_leases_are_judged_on_the_monotonic_clock(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"], lease_duration_s=30, lease_renew_s=5)
    a_clock = FakeClock(t=start_of(K) + 1, mono=100.0)
    b_clock = FakeClock(t=start_of(K) + 1, mono=900.0)
    a = Deployment.open(cfg, make_ports(redis_url, kube, "ctl@a", a_clock), "llama").leadership
    b = Deployment.open(cfg, make_ports(redis_url, kube, "ctl@b", b_clock), "llama").leadership
    term, _, acquired = a.claim()
    assert term is not None and acquired
    assert b.claim()[0] is None  # b starts timing a's Lease (monotonic)

    # b's wall clock jumps a day ahead (a's Lease looks ancient by its renewTime): still a's.
    b_clock.t += DAY
    b_clock.mono += 1
    assert b.claim() == (None, "ctl@a", False)
    # a's wall clock steps a day back: it keeps renewing the same term.
    a_clock.t -= DAY
    a_clock.mono += 10
    renewed, _, again = a.claim()
    assert renewed == term and not again
    a.check(term)

    # Only a whole lease_duration_s of b's monotonic time without a renewal hands the Lease over,
    # whatever the wall clocks say (b's steps back an hour meanwhile).
    b_clock.t -= 3600
    b_clock.mono += 29
    assert b.claim()[0] is None  # a renewed since b last looked: b's timer restarted
    b_clock.mono += 30
    took, _, acquired = b.claim()
    assert took is not None and acquired and took.term == term.term + 1
    with pytest.raises(Fenced):
        a.check(term)
    assert a.claim()[0] is None  # a now waits its own monotonic lease_duration_s for b's Lease
