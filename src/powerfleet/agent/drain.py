"""`powerfleet agent drain --node N`: the one way caps go back to their defaults.

A stop, a crash or a DaemonSet rollout leaves every cap in force (the next agent adopts them
from the state file). A drain is explicit: ``drain --node N`` sets
``powerfleet:agent:drain:<node>`` (value: a request id; it expires after ``agent.drain_ttl_s``
or ``--ttl``, at most ``agent.drain_max_ttl_s``, unless undone first); the
node's agent (the lock holder) sees it within ``POLL_S``, restores every managed GPU, stops
setting caps, and answers in ``powerfleet:agent:drained:<node>``
(``{"request", "restored", "left", "at"}``, kept a day). ``drain --undo`` deletes the request;
the agent enforces caps again at its next pass. An agent that starts while its node is
drained stays drained. A drain names a node that has, or had within ``agent.drain_retention_s``,
an agent (``presence.SEEN_KEY``), unless ``--force``.

``drain --all`` drains every node with a live agent at once and waits for all of their answers
(the chart's pre-delete hook runs it on ``helm uninstall``, with ``--ttl``: a request with a TTL
ends by itself, so a reinstall on the same Redis, or an uninstall that stopped after the hook,
does not leave the nodes drained for good).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from powerfleet.agent.presence import key_suffixes
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


def request_drain(r: redis.Redis, node: str, request: str, ttl_s: float | None = None) -> None:
    """Ask the node's agent to drain; with ``ttl_s`` the request (and so the drain) ends by itself."""
    r.set(drain_key(node), request, ex=max(1, int(ttl_s)) if ttl_s else None)


def unknown_node(node: str, live: bool, seen_at: float | None, now: float, retention_s: float) -> str | None:
    """Why ``node`` is not one a drain may name (None: it may): it must have, or have had within
    ``retention_s``, an agent; a drain for a typo would wait for an answer that never comes and
    then reset the caps of any agent that later starts under that name."""
    if live or (seen_at is not None and now - seen_at <= retention_s):
        return None
    when = "never" if seen_at is None else f"last {now - seen_at:.0f} s ago"
    return (f"node {node!r} has no agent and had none within agent.drain_retention_s ({retention_s:g} s; "
            f"{when}); check the name, or drain it anyway with --force")


def drain_ttl(requested_s: float | None, default_s: float, max_s: float) -> float:
    """The TTL a drain order gets: every order expires (ValueError above the configured maximum)."""
    if requested_s is None:
        return default_s
    if requested_s > max_s:
        raise ValueError(f"--ttl: {requested_s:g} s is above agent.drain_max_ttl_s ({max_s:g} s)")
    return requested_s


def pending_drains(r: redis.Redis) -> dict[str, dict[str, Any]]:
    """Node -> its drain order in force: the request, seconds until it expires (None: never, an
    order written before every order expired) and whether its agent has answered it."""
    out: dict[str, dict[str, Any]] = {}
    for node in sorted(drained_nodes(r)):
        raw, ttl = r.get(drain_key(node)), r.ttl(drain_key(node))
        if raw is None:
            continue  # expired or undone between the scan and the read
        request = raw.decode("utf-8", "replace")[:200]
        ack = read_ack(r, node)
        out[node] = {"request": request, "expires_in_s": ttl if ttl >= 0 else None,
                     "answered": ack is not None and ack.get("request") == request}
    return out


def drained_nodes(r: redis.Redis) -> set[str]:
    """Nodes with a drain request in force."""
    return key_suffixes(r, DRAIN_PREFIX)


def wait_for_answers(r: redis.Redis, requests: Mapping[str, str], timeout_s: float, *, poll_s: float = 0.2,
                     monotonic: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> dict[str, dict[str, Any] | None]:
    """Node -> its agent's answer to our request, or None where none came within ``timeout_s``."""
    answers: dict[str, dict[str, Any] | None] = {n: None for n in requests}
    deadline = monotonic() + timeout_s
    while True:
        for node, request in requests.items():
            if answers[node] is None:
                got = read_ack(r, node)
                if got is not None and got.get("request") == request:
                    answers[node] = got
        if all(a is not None for a in answers.values()) or monotonic() >= deadline:
            return answers
        sleep(poll_s)  # polling the caller's own deadline, not synchronisation


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
