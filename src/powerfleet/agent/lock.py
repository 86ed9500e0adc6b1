"""One agent per node: a lock in Redis, ``powerfleet:agent:lock:<node>``.

Taken with ``SET NX`` and a TTL of three reconcile intervals (the heartbeat's horizon),
renewed with every heartbeat by compare-and-set on the holder's identity, released by
compare-and-delete after the agent's last write. A second agent for the same node refuses to
start in one line; an agent that does not hold the lock never restores or sets a limit.

The holder's identity is JSON ``{"id", "host", "pid", "boot", "start"}``. A holder on this
machine (same kernel boot id) whose process is gone (no ``/proc/<pid>``, or another process
with that pid) is dead: its lock is taken over at once, so a crashed agent's successor need
not wait for the TTL. Anything else waits for the TTL.

While Redis is unreachable the holder keeps the lock (its caps must go on being enforced);
it loses it only when it sees another holder's identity in the key. An agent that could not
take it because Redis was unreachable (``unreachable``) applies only the caps its state owes
(agent/lifecycle.py), which the node-local lock makes safe.

**The node-local lock** (``LocalLock``): beside the Redis lock, whatever the broker, an agent
holds an exclusive ``flock`` on ``<agent.state_dir>/<node>.lock`` for its lifetime, so a
second agent on the same machine (a second ``powerfleet up`` with its own embedded Redis)
refuses to start in one line. The kernel drops the lock when the process dies, however.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import uuid as uuidlib
from pathlib import Path
from typing import Any

import redis

log = logging.getLogger("powerfleet.agent")

LOCK_PREFIX = "powerfleet:agent:lock:"

# KEYS[1] lock key; ARGV[1] our value; ARGV[2] ttl s. 1: renewed (or re-taken after it expired), 0: someone else's.
_RENEW = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('EXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_TAKEOVER = """
if redis.call('GET', KEYS[1]) == ARGV[2] then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3]) return 1 end
return 0
"""


class LockHeld(Exception):
    """Another live agent holds the node's lock (the message is the one line to print)."""


def lock_key(node: str) -> str:
    return LOCK_PREFIX + node


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(4096).strip()
    except OSError:
        return ""


def process_start(pid: int, proc: str = "/proc") -> str:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks): tells a reused pid apart."""
    stat = _read(f"{proc}/{pid}/stat")
    after = stat.rpartition(")")[2].split()
    return after[19] if len(after) > 19 else ""


def identity() -> dict[str, Any]:
    pid = os.getpid()
    return {"id": uuidlib.uuid4().hex, "host": socket.gethostname(), "pid": pid,
            "boot": _read("/proc/sys/kernel/random/boot_id"), "start": process_start(pid)}


def holder_is_dead(holder: dict[str, Any], me: dict[str, Any]) -> bool:
    """True only when the holder provably ran on this boot of this machine and its process is gone."""
    if not me.get("boot") or holder.get("boot") != me.get("boot"):
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if not Path(f"/proc/{pid}").exists():
        return True
    return bool(holder.get("start")) and process_start(pid) != holder.get("start")


def describe_holder(raw: bytes | str | None) -> tuple[dict[str, Any], str]:
    if raw is None:
        return {}, "nobody"
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        data = json.loads(text)
    except ValueError:
        return {}, f"an unreadable holder {text[:60]!r}"
    if not isinstance(data, dict):
        return {}, f"an unreadable holder {text[:60]!r}"
    return data, f"pid {data.get('pid')} on {data.get('host')}"


class NodeLock:
    def __init__(self, r: redis.Redis, node: str, ttl_s: int, me: dict[str, Any] | None = None) -> None:
        self.r, self.node, self.ttl_s = r, node, int(ttl_s)
        self.me = me or identity()
        self.value = json.dumps(self.me, sort_keys=True)
        self.key = lock_key(node)
        self.held = False
        self.why = "not taken yet"
        self.unreachable = False  # not held because Redis could not be asked (never another holder)

    def acquire(self) -> None:
        """Take the lock or raise ``LockHeld``; RedisError when Redis cannot be asked."""
        if self.r.set(self.key, self.value, nx=True, ex=self.ttl_s):
            self._got("taken")
            return
        raw = self.r.get(self.key)
        if raw is not None and raw.decode("utf-8", "replace") == self.value:
            self._got("already ours")
            return
        holder, who = describe_holder(raw)
        if raw is None:
            return self.acquire()  # expired between SET and GET
        if holder and holder_is_dead(holder, self.me):
            if self.r.eval(_TAKEOVER, 1, self.key, self.value, raw, self.ttl_s):
                log.warning("node %s: the previous agent (%s) is gone; took over its lock", self.node, who)
                self._got("taken over")
                return
        ttl = self.r.ttl(self.key)
        raise LockHeld(f"another agent for node {self.node} is running ({who}; lock {self.key} expires in "
                       f"{max(ttl, 0)} s unless renewed); refusing to start")

    def _got(self, how: str) -> None:
        self.held, self.why, self.unreachable = True, how, False

    def renew(self) -> bool:
        """With each heartbeat. False (and ``held`` off) when another agent holds the key now;
        a Redis error leaves ``held`` as it was (the caller logs the outage)."""
        if self.r.eval(_RENEW, 1, self.key, self.value, self.ttl_s):
            if not self.held:
                log.warning("node %s: node lock taken again", self.node)
            self._got("renewed")
            return True
        _, who = describe_holder(self.r.get(self.key))
        if self.held:
            log.error("node %s: the node lock is now held by %s; this agent stops setting limits", self.node, who)
        self.held, self.why, self.unreachable = False, f"held by {who}", False
        return False

    def release(self) -> None:
        """After the agent's last write; never raises (the key expires on its own)."""
        if not self.held:
            return
        self.held, self.why = False, "released"
        try:
            self.r.eval(_RELEASE, 1, self.key, self.value)
        except (redis.RedisError, OSError):
            pass


class LocalLock:
    """An exclusive ``flock`` on a file in the state directory, held for the agent's lifetime."""

    def __init__(self, path: str | os.PathLike[str], node: str) -> None:
        self.path, self.node = Path(path), node
        self._fd: int | None = None

    def acquire(self) -> "LocalLock":
        """Take it or raise ``LockHeld`` (one line) naming the holder's pid, or why the file cannot be
        opened: without it no agent may start (it could not tell a second one)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LockHeld(f"cannot open the node-local lock {self.path} ({exc.strerror or exc}); refusing to "
                           "start") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise LockHeld(f"another agent for node {self.node} is running on this machine (pid {holder} holds "
                           f"{self.path}); refusing to start") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing drops the flock
