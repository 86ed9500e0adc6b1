"""One agent per node: the Redis lock against a real redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

from powerfleet.agent.lock import LockHeld, NodeLock, identity, lock_key
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 - fixtures


@pytest.fixture
def r(broker_url: str) -> redis.Redis:  # noqa: F811
    return redis.Redis.from_url(broker_url)


def test_a_second_agent_refuses_while_the_first_holds_the_lock(r: redis.Redis) -> None:
    first = NodeLock(r, "n1", 45)
    first.acquire()
    second = NodeLock(r, "n1", 45, me={**identity(), "id": "other"})
    with pytest.raises(LockHeld, match=r"another agent for node n1 is running \(pid \d+ on .*\); refusing to start"):
        second.acquire()
    assert first.renew() and first.held
    NodeLock(r, "n2", 45).acquire()  # another node's agent is not affected


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(r: redis.Redis) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    me = identity()
    r.set(lock_key("n1"), json.dumps({**me, "id": "crashed", "pid": gone.pid, "start": "1"}), ex=45)
    lock = NodeLock(r, "n1", 45, me=me)
    lock.acquire()
    assert lock.held and json.loads(r.get(lock_key("n1")))["id"] == me["id"]


def test_a_holder_on_another_machine_is_waited_for(r: redis.Redis) -> None:
    r.set(lock_key("n1"), json.dumps({"id": "x", "host": "elsewhere", "pid": 1, "boot": "another-boot"}), ex=45)
    with pytest.raises(LockHeld, match="pid 1 on elsewhere"):
        NodeLock(r, "n1", 45).acquire()


def test_a_holder_that_sees_another_identity_stops_and_release_never_deletes_anothers_lock(r: redis.Redis) -> None:
    lock = NodeLock(r, "n1", 45)
    lock.acquire()
    r.set(lock_key("n1"), json.dumps({"id": "usurper", "pid": 1}))  # e.g. after its key expired in an outage
    assert not lock.renew() and not lock.held and "pid 1" in lock.why
    lock.held = True
    lock.release()
    assert json.loads(r.get(lock_key("n1")))["id"] == "usurper"
    r.delete(lock_key("n1"))
    assert lock.renew() and lock.held  # an expired key is taken again by its last holder


def test_a_holder_from_another_boot_is_waited_for_even_when_its_pid_is_absent_here(r: redis.Redis) -> None:
    """Issue 37 finding 1: without the boot-id comparison a live agent elsewhere (its pid absent
    locally) would be taken over, and two agents would cap one node."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    me = identity()
    r.set(lock_key("n1"), json.dumps({**me, "id": "elsewhere", "pid": gone.pid, "boot": "another-boot"}), ex=45)
    with pytest.raises(LockHeld, match=f"pid {gone.pid}"):
        NodeLock(r, "n1", 45, me=me).acquire()
    assert json.loads(r.get(lock_key("n1")))["id"] == "elsewhere"


def test_a_second_agent_on_this_machine_refuses_whatever_its_broker(tmp_path) -> None:
    """Issue 29 item 5: the node-local lock, a flock in the state directory."""
    from powerfleet.agent.lock import LocalLock

    first = LocalLock(tmp_path / "n1.lock", "n1").acquire()
    with pytest.raises(LockHeld, match=rf"another agent for node n1 is running on this machine \(pid {os.getpid()}"):
        LocalLock(tmp_path / "n1.lock", "n1").acquire()
    LocalLock(tmp_path / "n2.lock", "n2").acquire().release()  # another node: its own lock
    other = subprocess.run([sys.executable, "-c", "import sys; from powerfleet.agent.lock import LocalLock\n"
                            f"LocalLock({str(tmp_path / 'n1.lock')!r}, 'n1').acquire()"], capture_output=True, text=True)
    assert other.returncode != 0 and "refusing to start" in other.stderr, other
    first.release()
    LocalLock(tmp_path / "n1.lock", "n1").acquire().release()  # released: the next agent starts


def test_build_runtime_refuses_a_second_agent_for_the_node_without_any_broker(tmp_path) -> None:
    from powerfleet.agent.build import build_runtime
    from powerfleet.config import FleetConfig

    config = FleetConfig.model_validate({"agent": {"gpu_backend": "simulated", "simulated_dir": str(tmp_path / "sim"),
                                                   "state_dir": str(tmp_path / "state"),
                                                   "kubeconfig": str(tmp_path / "no-kubeconfig")}})
    from prometheus_client import CollectorRegistry

    from powerfleet.agent.metrics import AgentMetrics

    def build():
        return build_runtime(config, "n1", probe=("127.0.0.1", 0), metrics=AgentMetrics(CollectorRegistry()))
    first = build()
    try:
        with pytest.raises(LockHeld, match="another agent for node n1 is running on this machine"):
            build()
    finally:
        first.stop()
    build().stop()  # the first one's stop released it


def test_a_node_local_lock_that_cannot_be_made_refuses_in_one_line(tmp_path) -> None:
    from powerfleet.agent.lock import LocalLock

    (tmp_path / "file").write_text("")
    with pytest.raises(LockHeld, match=r"cannot open the node-local lock .* refusing to start"):
        LocalLock(tmp_path / "file" / "n1.lock", "n1").acquire()  # its directory is a file
