"""`agent drain --all` against a real redis-server: what the chart's uninstall hook reports when
an agent does not answer (the hook fails, and with it the uninstall), and a TTL on the request."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import redis

from powerfleet.agent.drain import drain_key, drained_nodes, request_drain, wait_for_answers
from powerfleet.agent.presence import beat
from powerfleet.clock import FakeClock
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures


def drain_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POWERFLEET_BROKER__URL": url}
    return subprocess.run([sys.executable, "-m", "powerfleet.cli", "agent", "drain", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_a_live_agent_that_does_not_answer_fails_the_drain_and_names_its_node(broker_url: str) -> None:  # noqa: F811
    r = redis.Redis.from_url(broker_url)
    beat(r, "gpu-silent", 15, FakeClock(t=1000.0))  # a heartbeat, but no agent behind it
    out = drain_cli(broker_url, "--all", "--json", "--timeout", "0.5", "--ttl", "600")
    assert out.returncode == 1, out.stderr
    answer = json.loads(out.stdout)["nodes"]["gpu-silent"]
    assert answer["answered"] is False and answer["request"]
    assert 0 < r.ttl(drain_key("gpu-silent")) <= 600  # the request stays (with its TTL): the agent acts when it runs
    assert drained_nodes(r) == {"gpu-silent"}
    undo = drain_cli(broker_url, "--all", "--undo")
    assert undo.returncode == 0 and "gpu-silent: drain undone" in undo.stdout
    assert drained_nodes(r) == set()


def test_no_live_agent_is_nothing_to_drain_and_node_or_all_is_required(broker_url: str) -> None:  # noqa: F811
    out = drain_cli(broker_url, "--all", "--timeout", "0")
    assert out.returncode == 0 and "no live agent: nothing to drain" in out.stdout
    both = drain_cli(broker_url, "--all", "--node", "gpu-a")
    assert both.returncode == 2 and "exactly one of them" in both.stderr and "Traceback" not in both.stderr


def test_answers_are_collected_per_node_until_the_deadline(broker_url: str) -> None:  # noqa: F811
    r = redis.Redis.from_url(broker_url)
    request_drain(r, "gpu-a", "req-a")
    request_drain(r, "gpu-b", "req-b", ttl_s=30)
    assert r.ttl(drain_key("gpu-a")) == -1 and 0 < r.ttl(drain_key("gpu-b")) <= 30
    r.set("powerfleet:agent:drained:gpu-a", json.dumps({"request": "req-a", "restored": [], "left": []}))
    r.set("powerfleet:agent:drained:gpu-b", json.dumps({"request": "an older one"}))
    clock = FakeClock(mono=0.0)
    got = wait_for_answers(r, {"gpu-a": "req-a", "gpu-b": "req-b"}, 1.0, monotonic=clock.monotonic,
                           sleep=clock.advance)
    assert got == {"gpu-a": {"request": "req-a", "restored": [], "left": []}, "gpu-b": None}
