"""Drain orders (issue 29, defect 4), against a real redis-server: a drain names a node that has or had an
agent (else `--force`), every order expires, and `status` lists the orders in force."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import redis

from powerfleet.agent.drain import drain_key, drain_ttl, unknown_node
from powerfleet.agent.presence import beat, heartbeat_key, last_seen
from powerfleet.clock import FakeClock
from tests.envs import subprocess_env
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures

DAY = 86400.0


def cli(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = subprocess_env()
    full.update({"POWERFLEET_BROKER__URL": url, **(env or {})})
    return subprocess.run([sys.executable, "-m", "powerfleet.cli", *args], capture_output=True, text=True,
                          timeout=60, env=full)


def test_a_drain_for_a_node_that_never_had_an_agent_is_refused_at_once(broker_url: str) -> None:  # noqa: F811
    r = redis.Redis.from_url(broker_url)
    out = cli(broker_url, "agent", "drain", "--node", "gpu-nodee-a")  # a typo: today it waited 60 s
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "node 'gpu-nodee-a' has no agent" in out.stderr and "--force" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert r.get(drain_key("gpu-nodee-a")) is None
    forced = cli(broker_url, "agent", "drain", "--node", "gpu-nodee-a", "--force", "--timeout", "0", "--json")
    assert forced.returncode == 1, forced.stderr  # nobody answers; the order stays, with an expiry
    assert 0 < r.ttl(drain_key("gpu-nodee-a")) <= 7 * DAY, r.ttl(drain_key("gpu-nodee-a"))


def test_a_node_whose_agent_left_recently_is_drained_and_every_order_expires(broker_url: str) -> None:  # noqa: F811
    r = redis.Redis.from_url(broker_url)
    beat(r, "gpu-gone", 15, FakeClock(t=time.time() - 3600))  # its agent beat an hour ago, then left
    r.delete(heartbeat_key("gpu-gone"))
    assert last_seen(r, "gpu-gone") is not None
    out = cli(broker_url, "agent", "drain", "--node", "gpu-gone", "--timeout", "0", "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["answered"] is False, (out.stdout, out.stderr)
    assert 7 * DAY - 60 < r.ttl(drain_key("gpu-gone")) <= 7 * DAY  # agent.drain_ttl_s by default
    too_long = cli(broker_url, "agent", "drain", "--node", "gpu-gone", "--ttl", str(31 * DAY))
    assert too_long.returncode == 2 and "above agent.drain_max_ttl_s" in too_long.stderr, too_long.stderr
    short = cli(broker_url, "agent", "drain", "--node", "gpu-gone", "--timeout", "0", env={
        "POWERFLEET_AGENT__DRAIN_TTL_S": "120", "POWERFLEET_AGENT__DRAIN_RETENTION_S": "7200"})
    assert short.returncode == 1 and 0 < r.ttl(drain_key("gpu-gone")) <= 120, short.stderr
    # Outside a shorter retention window the same node is a name no agent used lately.
    stale = cli(broker_url, "agent", "drain", "--node", "gpu-gone", env={"POWERFLEET_AGENT__DRAIN_RETENTION_S": "60"})
    assert stale.returncode == 2 and "last 36" in stale.stderr, stale.stderr

    status = cli(broker_url, "status", "--json", "--timeout", "0.5")
    assert status.returncode == 0, status.stderr
    drains = json.loads(status.stdout)["drains"]
    assert set(drains) == {"gpu-gone"} and drains["gpu-gone"]["answered"] is False, drains
    assert 0 < drains["gpu-gone"]["expires_in_s"] <= 120, drains
    human = cli(broker_url, "status", "--timeout", "0.5")
    assert "pending drains: gpu-gone (not answered yet, expires in" in human.stdout, human.stdout


def test_the_drain_rules() -> None:
    now = 10 * DAY
    assert unknown_node("a", True, None, now, DAY) is None
    assert unknown_node("a", False, now - DAY, now, DAY) is None
    assert "last 86401 s ago" in unknown_node("a", False, now - DAY - 1, now, DAY)
    assert "never" in unknown_node("a", False, None, now, DAY)
    assert drain_ttl(None, 7 * DAY, 30 * DAY) == 7 * DAY and drain_ttl(60, 7 * DAY, 30 * DAY) == 60
