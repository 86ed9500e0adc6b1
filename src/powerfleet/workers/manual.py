"""A send by hand (`powerfleet trigger`, Flower's task API): one check for both, before anything is published.

``FleetCelery.check_send`` checks the task name and its arguments for every sender. A send by
hand can also name a queue and publishing options, and may carry anything a person pastes, so
it gets more: the payload size, the destination queue (a fleet queue; a node queue only with a
live agent behind it), and the options Celery would accept without a word (``countdown``,
``eta``, ``expires``, ``serializer``) bounded and in the forms Celery understands. Any other
option (``exchange``, ``routing_key``, ``headers``...) could route a message where nobody
reads it, so it is refused.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any, Mapping

from powerfleet.tasks.base import TaskInputError
from powerfleet.queues import NODE_QUEUE_PREFIX, RoutingError, family_of, is_fleet_queue, route_task

# The furthest ahead a send by hand may be scheduled or may stay valid: beyond a day, an order
# is more likely a typo (milliseconds for seconds) than a plan, and it would sit in Redis unseen.
MAX_DELAY_S = 86400.0
# The forms of ``eta``/``expires`` as text: Flower's own, and ISO 8601 (what Celery writes).
FLOWER_DATE_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
OPTIONS = ("queue", "countdown", "eta", "expires", "serializer")


class SendRefused(TaskInputError):
    """A send by hand the fleet will not publish (the message says why, in one line)."""


class NoLiveAgent(SendRefused):
    """The destination is a node queue that no live agent consumes."""


def payload_size(kwargs: Any) -> int:
    return len(json.dumps(kwargs, separators=(",", ":"), default=str).encode())


def check_payload(name: str, kwargs: Any, limit: int) -> None:
    size = payload_size(kwargs)
    if size > limit:
        raise SendRefused(f"{name}: arguments are {size} bytes of JSON, over the task API's limit of {limit} bytes "
                          "(task_api.max_payload_bytes)")


def _seconds(name: str, option: str, value: Any, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SendRefused(f"{name}: {option}: must be a number of seconds, got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not low_ok or value > MAX_DELAY_S:
        bound = "0" if allow_zero else "more than 0"
        raise SendRefused(f"{name}: {option}: must be {bound} to {MAX_DELAY_S:g} seconds, got {value!r}")
    return float(value)


def _date(name: str, option: str, value: Any, now: float) -> float:
    """Seconds from ``now`` to a date given as text (Flower's format or ISO 8601, UTC unless it says)."""
    if not isinstance(value, str):
        raise SendRefused(f"{name}: {option}: must be a date ('YYYY-MM-DD HH:MM:SS.ffffff' or ISO 8601), got {value!r}")
    parsed = None
    for parse in (lambda v: datetime.strptime(v, FLOWER_DATE_FORMAT), datetime.fromisoformat):
        try:
            parsed = parse(value)
            break
        except ValueError:
            continue
    if parsed is None:
        raise SendRefused(f"{name}: {option}: {value!r} is not a date ('YYYY-MM-DD HH:MM:SS.ffffff' or ISO 8601)")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp() - now


def _publish_options(name: str, options: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The options to publish with: delays as relative seconds (a form every Flower handler and Celery take)."""
    unknown = sorted(k for k in options if k not in OPTIONS)
    if unknown:
        raise SendRefused(f"{name}: option {unknown[0]!r} is not accepted; the task API takes {', '.join(OPTIONS)}")
    out: dict[str, Any] = {}
    serializer = options.get("serializer", "json")
    if serializer != "json":
        raise SendRefused(f"{name}: serializer: only 'json' is accepted (workers refuse anything else), got {serializer!r}")
    if "countdown" in options and "eta" in options:
        raise SendRefused(f"{name}: give countdown or eta, not both")
    if "countdown" in options:
        out["countdown"] = _seconds(name, "countdown", options["countdown"], allow_zero=True)
    if "eta" in options:
        delay = _date(name, "eta", options["eta"], now)
        if delay > MAX_DELAY_S:
            raise SendRefused(f"{name}: eta: more than {MAX_DELAY_S:g} seconds ahead")
        out["countdown"] = max(0.0, delay)  # a past eta runs now, as Celery does
    if "expires" in options:
        raw = options["expires"]
        if isinstance(raw, str):
            delay = _date(name, "expires", raw, now)
            if delay <= 0:
                raise SendRefused(f"{name}: expires: {raw!r} is in the past; the task would never run")
            raw = delay
        out["expires"] = _seconds(name, "expires", raw, allow_zero=False)
    if "queue" in options:
        queue = options["queue"]
        if not isinstance(queue, str) or not is_fleet_queue(queue):
            raise SendRefused(f"{name}: queue: {queue!r} is not a fleet queue (control, sweep or node.<node name>)")
        out["queue"] = queue
    return out


def check_manual_send(app: Any, name: str, args: Any, kwargs: Any, options: Mapping[str, Any], *,
                      now: float, node_expires_s: float, is_live: Any = None) -> dict[str, Any]:
    """Check a send by hand; return the options to publish it with, or raise a SendRefused/SEND_ERRORS.

    ``is_live(node) -> bool`` tells whether a node has a live agent (default: its heartbeat key).
    A node order carries ``expires`` of at most ``node_expires_s``, so one that nobody takes
    never runs hours later when an agent appears.
    """
    check_payload(name, kwargs, app.fleet_config.task_api.max_payload_bytes)
    app.check_send(name, args, kwargs, task_api=True)
    out = _publish_options(name, options, now)
    try:
        routed = (route_task(name, args, kwargs, {}) or {}).get("queue", "")
    except RoutingError as exc:
        raise SendRefused(str(exc)) from None
    queue = out.get("queue", routed)
    # Only an agent consumes a node queue, and it runs only its own node's orders.
    if family_of(name) == "node" and queue != routed:
        raise SendRefused(f"{name}: queue: {queue!r} is not this order's node queue {routed!r}; only that agent runs it")
    if family_of(name) != "node" and queue.startswith(NODE_QUEUE_PREFIX):
        raise SendRefused(f"{name}: queue: {queue!r} is a node queue; only powerfleet.agent.* tasks run there")
    if family_of(name) == "node":
        node = queue[len(NODE_QUEUE_PREFIX):]
        if not (is_live or _heartbeat(app))(node):
            raise NoLiveAgent(f"no live agent serves node {node!r} (no heartbeat); nothing sent")
        out["expires"] = min(out.get("expires", node_expires_s), node_expires_s)
    out["queue"] = queue
    return out


def _heartbeat(app: Any) -> Any:
    from powerfleet.agent.presence import heartbeat_key
    from powerfleet.tasks.ports import fleet_redis

    r = fleet_redis(app)
    return lambda node: bool(r.exists(heartbeat_key(node)))
