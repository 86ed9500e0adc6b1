"""Fixtures shared with the suites whose worlds these tests reuse: a real redis-server (session
and per-module), the retune test world (loopback API server, frontends, trace directory); and
one replicated Redis behind three Sentinels for every Sentinel test of the session, handed to
each test whole again (``sentinels``)."""

from collections.abc import Iterator

import pytest

from powerfleet.testing.sentinels import TEST_PASSWORD, SentinelCluster
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures
from tests.retune.conftest import kube, redis_url, world  # noqa: F401 - fixtures


@pytest.fixture(scope="session")
def sentinel_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    """A master, two replicas (the second never promoted) and three Sentinels with short periods,
    min-replicas-to-write 1: started once, shared by every Sentinel test (each uses its own
    database for the fleet's keys)."""
    with SentinelCluster(tmp_path_factory.mktemp("sentinels"), replicas=2, password=TEST_PASSWORD,
                         min_replicas_to_write=1, fast=True, failover_timeout_ms=4000, unpromotable=1) as cluster:
        yield cluster


@pytest.fixture
def sentinels(sentinel_cluster: SentinelCluster) -> SentinelCluster:
    """The shared cluster made whole: what an earlier test killed or cut is back, Sentinels agree."""
    sentinel_cluster.restore()
    return sentinel_cluster
