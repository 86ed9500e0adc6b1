"""The fleet's Redis clients on real servers: the broker epoch (broker/epoch.py: a record from
before a promotion is not trusted by the budget), NOREPLICAS as an outage (broker/publish.py: a
ConnectionError every client waits out), and a client of the one factory (broker/clients.py)
writing through a graceful failover, on the session's Sentinel cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from powerfleet.broker.clients import redis_client
from powerfleet.broker.epoch import broker_epoch
from powerfleet.broker.publish import NoReplicas, is_noreplicas, noreplicas_is_unavailable
from powerfleet.budget.state import REPLICAS, BudgetState
from powerfleet.config import load_config
from powerfleet.testing.sentinels import TEST_PASSWORD, SentinelCluster

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
    assert isinstance(err.value, redis.ConnectionError) and is_noreplicas(err.value)
    # In a transaction too (kombu binds a queue with one): a NoReplicas that were also a
    # ResponseError was collected as the queued command's error while redis-py dropped the
    # connection, and the pipeline read the next reply from a closed socket (AttributeError,
    # not an outage anyone retries: a publish that declared its queue failed at once).
    with master.pipeline() as pipe:
        pipe.sadd("a", "x").sadd("b", "y")
        with pytest.raises(NoReplicas):
            pipe.execute()
    master.config_set("min-replicas-to-write", 0)
    assert master.exists("a", "b") == 0  # the refused transaction wrote nothing
    assert master.set("k", "v") and master.get("k") == b"v"


def test_a_client_writing_through_a_graceful_failover_reaches_the_new_master(sentinels: SentinelCluster) -> None:
    """A write under way when the failover starts: the old master refuses it (NOREPLICAS here for
    every write, then READONLY once demoted) and the client retries. Each retry must dial the
    master the Sentinels name: redis-py 8 alone redialled the old address until its retries ran
    out (FollowingConnection, broker/clients.py)."""
    db = 3
    noreplicas_is_unavailable()
    client = redis_client(sentinels.url_for(db), load_config(environ=sentinels.env(db)).broker, socket_timeout=5)
    client.set("through", "before")  # its pooled connection is on the old master
    old = sentinels.master_port()
    refusing = sentinels.client(old)
    refusing.config_set("min-replicas-to-write", 5)  # more than it has: it takes no write now
    try:
        with ThreadPoolExecutor(1) as pool:
            write = pool.submit(client.set, "through", "after")
            sentinels.graceful_failover()
            new = sentinels.wait_new_master(old)
            assert write.result(timeout=60)
    finally:
        refusing.config_set("min-replicas-to-write", 1)
        refusing.close()
    promoted = redis.Redis(port=new, db=db, password=TEST_PASSWORD, socket_timeout=5)
    assert promoted.get("through") == b"after"
    promoted.delete("through")
    promoted.close()
    client.close()
