"""Flower's queue view (the Broker page and ``/api/queues/length``) says which worker consumes each queue.

Two things left its Consumers column empty for this fleet:

- Flower's Redis broker adapter reads only ``LLEN`` per queue; consumers come from RabbitMQ's
  management API alone, so on Redis the column is never filled. The workers do say what they
  consume (``inspect active_queues``, which Flower already asks); here each row gets the names
  of the live workers that reported the queue, or ``none``.
- Flower inspects workers once when it starts and again only when someone asks for a refresh.
  Under ``up`` (and in a rollout) the workers and agents start after Flower, so its cache stayed
  empty. A queue view re-inspects first when a worker that sends heartbeats is missing from the
  cache or the cache is older than ``MAX_AGE_S`` (one inspect round, at most Flower's
  ``inspect_timeout``).

A ``node.*`` list in Redis that no live worker reports (an agent that is gone) is listed too,
with consumers ``none``, so its backlog does not vanish from Flower (``powerfleet status``
shows the same). Nothing here controls a worker: inspect is read-only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from powerfleet.queues import NODE_QUEUE_PREFIX

log = logging.getLogger(__name__)

MAX_AGE_S = 15.0
NO_CONSUMER = "none"


def consumers_by_queue(inspected: Mapping[str, Mapping[str, Any]], offline: Collection[str] = ()) -> dict[str, list[str]]:
    """Queue name -> the workers whose last ``active_queues`` reply names it (offline workers left out)."""
    out: dict[str, set[str]] = {}
    for worker, info in inspected.items():
        if worker in offline:
            continue
        for queue in (info.get("active_queues") or []) if isinstance(info, Mapping) else []:
            name = queue.get("name") if isinstance(queue, Mapping) else None
            if isinstance(name, str) and name:
                out.setdefault(name, set()).add(worker)
    return {name: sorted(workers) for name, workers in sorted(out.items())}


def needs_inspection(inspected: Mapping[str, Mapping[str, Any]], alive: Collection[str], now: float,
                     max_age_s: float = MAX_AGE_S) -> bool:
    """Whether Flower's worker cache is too old to say who consumes what.

    ``alive``: workers whose heartbeats Flower receives. One of them missing from the cache (it
    started after Flower's last inspection), or a reply older than ``max_age_s``, means inspect
    again. Workers not alive are not waited for: a dead one never answers.
    """
    considered = set(alive) if alive else set(inspected)
    if not considered:
        return True
    for worker in considered:
        info = inspected.get(worker)
        if not info or "active_queues" not in info or now - float(info.get("timestamp") or 0) > max_age_s:
            return True
    return False


def queue_rows(rows: list[dict[str, Any]], consumers: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    """Flower's rows with ``consumers`` filled: the workers' names, or ``none``."""
    return [{**row, "consumers": ", ".join(consumers.get(row.get("name"), [])) or NO_CONSUMER} for row in rows]


class ConsumerView:
    """Wraps the broker Flower builds for one request; its ``queues(names)`` adds the consumers."""

    def __init__(self, broker: Any, application: Any) -> None:
        self._broker = broker
        self._app = application

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)

    async def queues(self, names: Collection[str]) -> list[dict[str, Any]]:
        alive, offline = _liveness(self._app)
        if needs_inspection(self._app.workers, alive, time.time()):
            await self._inspect()
        consumers = consumers_by_queue(self._app.workers, offline)
        # Flower's names came from its cache before the refresh: add what the workers say now.
        wanted = set(names) | set(consumers) | set(await self._node_lists())
        rows = await self._broker.queues(sorted(wanted))
        return queue_rows(rows, consumers)

    async def _inspect(self) -> None:
        timeout_s = max(float(getattr(self._app.options, "inspect_timeout", 1000.0)) / 1000.0, 0.1) * 2 + 1
        try:
            await asyncio.wait_for(asyncio.shield(self._app.update_workers()), timeout_s)
        except Exception as exc:  # noqa: BLE001 - the page shows what the cache has; Flower logs the cause
            log.warning("flower: inspecting the workers for their queues failed: %s", exc)

    async def _node_lists(self) -> list[str]:
        """``node.*`` lists in Redis (the same SCAN as ``powerfleet status``); none on another broker."""
        client = getattr(self._broker, "redis", None)
        if client is None:
            return []
        prefix = getattr(self._broker, "broker_prefix", "") or ""
        sep = getattr(self._broker, "sep", "\x06\x16")
        found: list[str] = []
        try:
            async for key in client.scan_iter(match=f"{prefix}{NODE_QUEUE_PREFIX}*", count=1000, _type="list"):
                name = (key.decode() if isinstance(key, bytes) else str(key)).removeprefix(prefix)
                if sep not in name:  # a priority sub-list is summed into its queue by Flower
                    found.append(name)
        except Exception as exc:  # noqa: BLE001 - the page still lists the consumed queues
            log.warning("flower: listing node queues failed: %s", exc)
        return found


def _liveness(application: Any) -> tuple[set[str], set[str]]:
    """(alive, offline) worker names from the heartbeats Flower's event state has seen."""
    alive: set[str] = set()
    offline: set[str] = set()
    try:
        workers = dict(application.events.state.workers)
    except Exception:  # noqa: BLE001 - no event state yet: treat every cached worker as unknown
        return alive, offline
    for name, worker in workers.items():
        (alive if worker.alive else offline).add(name)
    return alive, offline


def install_queue_consumers() -> None:
    """Patch Flower's handlers (Broker page, /api/queues/length) to fill the Consumers column."""
    from flower.views import BaseHandler

    original = BaseHandler.get_broker
    if getattr(original, "_powerfleet_consumers", False):
        return

    def get_broker(self: Any) -> Any:
        return ConsumerView(original(self), self.application)

    get_broker._powerfleet_consumers = True  # type: ignore[attr-defined]
    BaseHandler.get_broker = get_broker  # type: ignore[method-assign]
