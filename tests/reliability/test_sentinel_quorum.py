"""`status` under Sentinel quorum loss (issue 31 finding 9): how many Sentinels answered and whether a
failover can happen; after the master dies with no quorum, the start-up check says none can. Real
redis-server processes: a master, one replica, three Sentinels (its own cluster: this test kills them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.broker.clients import BrokerConfigError
from powerfleet.broker.topology import describe, find_master
from powerfleet.config.fleet import BrokerConfig
from powerfleet.testing.sentinels import SentinelCluster
from powerfleet.testing.waiting import wait_for

pytestmark = pytest.mark.integration


def test_status_says_how_many_sentinels_answer_and_whether_a_failover_can_happen(tmp_path: Path) -> None:
    with SentinelCluster(tmp_path / "s", replicas=1, fast=True) as cluster:
        broker = BrokerConfig.model_validate(cluster.broker_config())
        whole = describe(cluster.url, broker, timeout_s=1.0)
        assert (whole["sentinels_configured"], whole["sentinels_answered"], whole["failover_possible"]) == \
            (3, 3, True), whole
        for port in cluster.sentinel_ports[1:]:
            cluster.kill(port)  # two of three gone: one Sentinel cannot reach the quorum of 2
        lost = wait_for(lambda: _no_quorum(cluster.url, broker), "the last Sentinel to see its peers down",
                        timeout_s=30)
        assert lost["sentinels_answered"] == 1 and lost["sentinels"] == 3, lost  # it still counts them known
        assert lost["quorum_detail"].startswith("NOQUORUM"), lost
        cluster.kill(cluster.master_port())
        why = wait_for(lambda: _down(cluster.url, broker), "the Sentinel to see the master down", timeout_s=30)
        assert "no failover can happen: 1 of 3 Sentinels answer; NOQUORUM" in why and "\n" not in why, why
        assert "may be under way" not in why


def _no_quorum(url: str, broker: BrokerConfig) -> dict | None:  # type: ignore[type-arg]
    d = describe(url, broker, timeout_s=0.5)
    return None if d["failover_possible"] else d


def _down(url: str, broker: BrokerConfig) -> str | None:
    try:
        find_master(url, broker, timeout_s=0.5)
    except BrokerConfigError as exc:
        return str(exc) if "down" in str(exc) else None
    return None
