"""The broker epoch (broker/epoch.py) and NOREPLICAS as an outage (broker/publish.py), on a real
master and replica: a record from before a promotion is not trusted by the budget; a refused
write is a ConnectionError that every Redis client of the process waits out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from powerfleet.broker.epoch import broker_epoch
from powerfleet.broker.publish import NoReplicas, is_noreplicas, noreplicas_is_unavailable
from powerfleet.budget.state import REPLICAS, BudgetState
from tests.reliability.sentinels import SentinelCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    with SentinelCluster(tmp_path, replicas=1, sentinels=0) as cluster:
        master, replica = (redis.Redis(port=p, socket_timeout=5, retry=Retry(NoBackoff(), 0)) for p in cluster.redis_ports)
        yield master, replica
        master.close()
        replica.close()


def test_counts_recorded_before_a_promotion_are_not_trusted(pair: tuple[redis.Redis, redis.Redis]) -> None:
    master, replica = pair
    before = BudgetState(master)
    assert before.last_replicas("ns/a") is None
    before.record_replicas("ns/a", {"decode": 2})
    assert BudgetState(master).last_replicas("ns/a") == {"decode": 2}  # same epoch: trusted
    master.hset(REPLICAS, "ns/legacy", json.dumps({"decode": 1}))  # a record from before epochs
    master.wait(1, 5000)  # both on the replica
    assert replica.hget(REPLICAS, "ns/a") is not None and broker_epoch(replica) == broker_epoch(master)

    replica.replicaof("NO", "ONE")  # what Sentinel does to the replica it promotes
    assert broker_epoch(replica) != broker_epoch(master)
    after = BudgetState(replica)
    assert after.last_replicas("ns/a") is None  # older than the failover: re-derived, not compared
    assert after.last_replicas("ns/legacy") == {"decode": 1}  # no epoch to judge by: as before
    after.last_replicas("ns/a")
    after.record_replicas("ns/a", {"decode": 3})
    assert BudgetState(replica).last_replicas("ns/a") == {"decode": 3}


def test_a_write_refused_with_noreplicas_is_a_connection_error(pair: tuple[redis.Redis, redis.Redis]) -> None:
    master, _ = pair
    noreplicas_is_unavailable()
    master.config_set("min-replicas-to-write", 2)  # more than the one replica it has
    with pytest.raises(NoReplicas) as err:
        master.set("k", "v")
    assert isinstance(err.value, redis.ConnectionError) and isinstance(err.value, redis.ResponseError)
    assert is_noreplicas(err.value)
    master.config_set("min-replicas-to-write", 0)
    assert master.set("k", "v") and master.get("k") == b"v"
