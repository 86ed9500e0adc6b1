"""`powerfleet agent drain --node N`: the one way caps go back to their defaults.

A stop, a crash or a DaemonSet rollout leaves every cap in force (the next agent adopts them
from the state file). A drain is explicit: ``drain --node N`` sets
``powerfleet:agent:drain:<node>`` (value: a request id; no TTL, it stays until undone); the
node's agent (the lock holder) sees it within ``POLL_S``, restores every managed GPU, stops
setting caps, and answers in ``powerfleet:agent:drained:<node>``
(``{"request", "restored", "left", "at"}``, kept a day). ``drain --undo`` deletes the request;
the agent enforces caps again at its next pass. An agent that starts while its node is
drained stays drained.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import redis

from powerfleet.clock import Clock

log = logging.getLogger("powerfleet.agent")

DRAIN_PREFIX = "powerfleet:agent:drain:"
DRAINED_PREFIX = "powerfleet:agent:drained:"
POLL_S = 2.0
ACK_TTL_S = 86_400


def drain_key(node: str) -> str:
    return DRAIN_PREFIX + node


def drained_key(node: str) -> str:
    return DRAINED_PREFIX + node


def request_drain(r: redis.Redis, node: str, request: str) -> None:
    r.set(drain_key(node), request)


def undo_drain(r: redis.Redis, node: str) -> bool:
    r.delete(drained_key(node))
    return bool(r.delete(drain_key(node)))


def read_ack(r: redis.Redis, node: str) -> dict[str, Any] | None:
    raw = r.get(drained_key(node))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class DrainWatcher:
    """Polls the node's drain request and drains or undrains the runtime; Redis errors are one
    warning per outage (a drain waits for Redis; caps stay meanwhile)."""

    def __init__(self, r: redis.Redis, runtime: Any, clock: Clock, poll_s: float = POLL_S) -> None:
        self.r, self.rt, self.clock, self.poll_s = r, runtime, clock, poll_s
        self.node = runtime.node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"agent-drain-{self.node}", daemon=True)
        self._failing = False

    def check_once(self) -> None:
        try:
            raw = self.r.get(drain_key(self.node))
        except (redis.RedisError, OSError) as exc:
            if not self._failing:
                log.warning("node %s: cannot read the drain request (%s); retrying", self.node,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self._failing = True
            return
        self._failing = False
        if raw is None:
            self.rt.undrain()
            return
        request = raw.decode("utf-8", "replace")[:200]
        ack = read_ack(self.r, self.node)
        if self.rt.drained and ack is not None and ack.get("request") == request:
            return
        log.warning("node %s: drain requested (%s); restoring the default on every managed GPU", self.node, request)
        managed = sorted(self.rt.agent.managed)
        left = self.rt.drain()
        answer = {"request": request, "restored": sorted(set(managed) - set(left)), "left": sorted(left),
                  "drained": self.rt.drained, "at": self.clock.now()}
        try:
            self.r.set(drained_key(self.node), json.dumps(answer, sort_keys=True), ex=ACK_TTL_S)
        except (redis.RedisError, OSError):
            pass  # the CLI times out and says so; the restore itself is done

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check_once()
            except Exception:
                log.exception("node %s: drain check failed", self.node)

    def start(self) -> "DrainWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
