"""Which agents are alive: a heartbeat key per node in Redis, with a TTL.

Every agent sets ``powerfleet:agent:alive:<node>`` (value: the epoch time it was written)
every reconcile interval, with a TTL of three intervals, the same horizon after which the
agent itself falls back to its local timer and its readiness fails. A key disappears on its
own when its agent has been gone that long, so ``live_agents`` needs no cleanup, and an
agent that stops cleanly deletes its key at once.

The reconcile tick fans out to the union of ``nodes`` in the config and ``live_agents``;
``trigger``/``status`` use ``live_agents`` to tell a node without an agent.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from powerfleet.clock import Clock

log = logging.getLogger("powerfleet.agent")

KEY_PREFIX = "powerfleet:agent:alive:"
TTL_INTERVALS = 3
# node -> the epoch time of its agent's last heartbeat; kept after the heartbeat key lapses, so a
# drain can tell a node that had an agent (recently) from a typo (agent/drain.py).
SEEN_KEY = "powerfleet:agent:seen"


def heartbeat_key(node: str) -> str:
    return KEY_PREFIX + node


def heartbeat_ttl_s(reconcile_interval_s: float) -> int:
    """TTL for the heartbeat key: three reconcile intervals, at least 3 s (Redis TTLs are whole seconds)."""
    return max(3, int(round(TTL_INTERVALS * reconcile_interval_s)))


def beat(r: redis.Redis, node: str, reconcile_interval_s: float, clock: Clock) -> None:
    now = f"{clock.now():.3f}"
    pipe = r.pipeline(transaction=False)
    pipe.set(heartbeat_key(node), now, ex=heartbeat_ttl_s(reconcile_interval_s))
    pipe.hset(SEEN_KEY, node, now)
    pipe.execute()


def last_seen(r: redis.Redis, node: str) -> float | None:
    """When the node's agent last beat (None: never, as far as this Redis knows)."""
    raw = r.hget(SEEN_KEY, node)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def key_suffixes(r: redis.Redis, prefix: str) -> set[str]:
    """What follows ``prefix`` in every key that starts with it (SCAN, never KEYS: safe on a busy Redis)."""
    out: set[str] = set()
    for key in r.scan_iter(match=prefix + "*", count=1000):
        name = key.decode() if isinstance(key, bytes) else str(key)
        out.add(name[len(prefix):])
    return out


def live_agents(r: redis.Redis) -> set[str]:
    """Node names whose agent has a live heartbeat."""
    return key_suffixes(r, KEY_PREFIX)


class Heartbeat:
    """A daemon thread that keeps one node's key alive; Redis errors are one warning per outage."""

    def __init__(self, r: redis.Redis, node: str, reconcile_interval_s: float, clock: Clock,
                 lock: Any = None) -> None:
        self.r, self.node, self.interval, self.clock = r, node, reconcile_interval_s, clock
        self.lock = lock  # lock.NodeLock: renewed with every beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"agent-heartbeat-{node}", daemon=True)
        self._failing = False

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def beat_once(self) -> bool:
        try:
            beat(self.r, self.node, self.interval, self.clock)
            if self.lock is not None:
                self.lock.renew()
        except (redis.RedisError, OSError) as exc:
            if not self._failing:
                log.warning("heartbeat for %s failed (%s); retrying every %gs", self.node,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__, self.interval)
            self._failing = True
            return False
        if self._failing:
            log.info("heartbeat for %s restored", self.node)
        self._failing = False
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat_once()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop beating and delete the key, so the tick stops fanning out to this node at once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            self.r.delete(heartbeat_key(self.node))
        except (redis.RedisError, OSError):
            pass  # the key expires on its own
