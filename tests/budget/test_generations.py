"""The generation rule, one test per rule (budget/generations.py): the pure verdict, and the Redis
store (a real redis-server) the tick opens, publishes and the evaluation reads."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.generations import ALLOCATION, Allocations, Read, decode, encode, verdict
from powerfleet.budget.program import GroupLimit
from tests.integration.conftest import broker_url, redis_server  # noqa: F401

NOW = 1_767_000_000.0
GEN = int(NOW * 1000)
LIMIT = GroupLimit("rack-a", 3000, 1000, 2000, 6, None)


def read(sent=GEN, newest=GEN, published=GEN, record: bytes | None = encode(LIMIT).encode()) -> Read:
    return Read(sent, newest, published, record)


def test_the_newest_fresh_generation_applies_its_stored_allowance():
    assert verdict(read(), NOW + 5, 60) == LIMIT


def test_an_older_generation_is_outdated():
    why = verdict(read(newest=GEN + 1), NOW, 60)
    assert isinstance(why, str) and why.startswith("outdated") and str(GEN) in why, why


def test_a_generation_no_tick_opened_is_refused():
    for newest in (None, GEN - 1):
        why = verdict(read(newest=newest), NOW, 60)
        assert isinstance(why, str) and "never opened" in why, why


def test_an_unpublished_generation_is_refused():
    why = verdict(read(published=GEN - 5), NOW, 60)
    assert isinstance(why, str) and "published no allocation" in why, why


def test_a_stale_generation_is_refused_even_if_newest():
    why = verdict(read(), NOW + 61, 60)
    assert isinstance(why, str) and why.startswith("stale"), why


def test_a_deployment_missing_from_the_allocation_gets_nothing():
    why = verdict(read(record=None), NOW, 60)
    assert isinstance(why, str) and "not in" in why, why


@given(st.binary(max_size=200) | st.builds(lambda d: __import__("json").dumps(d).encode(), st.dictionaries(
    st.sampled_from(["group", "limit_w", "minimum_w", "current_w", "gpu_capacity", "admission", "x"]),
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3) | st.floats(allow_nan=True))))
@settings(max_examples=300, deadline=None)
def test_an_unreadable_record_is_no_allowance_never_a_crash(raw):
    got = decode(raw)
    assert got is None or (isinstance(got, GroupLimit) and (got.limit_w is None or got.limit_w >= 0)), got
    assert isinstance(verdict(read(record=raw), NOW, 60), (GroupLimit, str))


def test_records_round_trip():
    assert decode(encode(LIMIT).encode()) == LIMIT
    assert decode(encode(GroupLimit(None, None)).encode()) == GroupLimit(None, None)


@pytest.fixture
def store(broker_url):  # noqa: F811 - the imported fixture
    r = redis.Redis.from_url(broker_url)
    r.flushdb()
    yield Allocations(r), r
    r.flushdb()


def test_open_is_monotonic_when_the_clock_goes_back_and_after_a_flush(store):
    alloc, r = store
    first = alloc.open(NOW)
    assert first == GEN
    assert alloc.open(NOW - 100) == GEN + 1  # a clock behind the last generation: one past it
    r.flushdb()
    assert alloc.open(NOW + 1) > GEN + 1  # a flushed counter restarts at the time, above every id sent before


def test_publish_is_refused_once_a_later_tick_opened(store):
    alloc, r = store
    older = alloc.open(NOW)
    newer = alloc.open(NOW + 30)
    assert not alloc.publish(older, {"ns/a": LIMIT})
    assert r.hget(ALLOCATION, "ns/a") is None
    assert alloc.publish(newer, {"ns/a": LIMIT})
    assert verdict(alloc.read(newer, "ns/a"), NOW + 31, 60) == LIMIT
    why = verdict(alloc.read(older, "ns/a"), NOW + 31, 60)
    assert isinstance(why, str) and why.startswith("outdated"), why


def test_a_publish_replaces_the_whole_allocation(store):
    alloc, _ = store
    g1 = alloc.open(NOW)
    alloc.publish(g1, {"ns/a": LIMIT, "ns/b": LIMIT})
    g2 = alloc.open(NOW + 30)
    alloc.publish(g2, {"ns/a": GroupLimit("rack-a", 1000)})
    assert verdict(alloc.read(g2, "ns/b"), NOW + 31, 60) == "not in tick generation %d's allocation" % g2


def test_the_fence_turns_once_a_later_tick_opens(store):
    alloc, _ = store
    g = alloc.open(NOW)
    alloc.publish(g, {"ns/a": LIMIT})
    assert alloc.outdated(g) is None
    alloc.open(NOW + 30)  # before its reads: from here on the older evaluations may not write
    why = alloc.outdated(g)
    assert why is not None and why.startswith("outdated"), why
