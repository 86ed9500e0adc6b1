"""A stopping worker gives its Leases up when its stop begins, not when its drain ends.

Celery's warm shutdown (SIGTERM) lets the tasks it is running finish before the process
exits; a sweep shard of a long window can run for minutes, longer than a pod's grace period,
and a SIGKILL at the end of that period left the Leases held for ``lease_duration_s`` (issue 33
item 7). So the stop has two passes:

* **begin** (Celery's ``worker_shutting_down``, in the main process, the moment the signal
  arrives): mark this identity as stopping in Redis, then release every Lease it holds. From
  then on its own tasks that are still running cannot lead: ``Leadership.claim`` refuses while
  the mark is set, and a claim whose update landed just before the mark gives the Lease back
  at once (it checks the mark after its write, as the release reads the Lease after its mark,
  so one of the two always sees the other). Their fenced writes fail (the Lease no longer
  names them), which is a handover like any other: a peer decides their sweeps.
* **finish** (``worker_shutdown``, after the drain): release again, then clear the mark.

A worker that starts under the same identity clears the mark (``clear``). The mark expires on
its own after ``MARK_TTL_S`` should neither pass run.
"""

from __future__ import annotations

import logging
import time

import redis

from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune import control
from powerfleet.retune.context import Ports
from powerfleet.retune.fanin import PREFIX

MARK_TTL_S = 3600
log = logging.getLogger(__name__)


def mark_key(identity: str) -> str:
    return f"{PREFIX}stopping:{identity}"


def stopping(r: redis.Redis, identity: str) -> bool:
    """Whether ``identity`` has begun to stop (Redis unreachable: not known to, False)."""
    try:
        return bool(r.exists(mark_key(identity)))
    except redis.RedisError:
        return False


def clear(r: redis.Redis, identity: str) -> None:
    r.delete(mark_key(identity))


def begin(cfg: RetuneConfig, ports: Ports) -> list[str]:
    """The stop began: mark, then release (the deployments released)."""
    try:
        ports.r.set(mark_key(ports.identity), "1", ex=MARK_TTL_S)
    except redis.RedisError:  # without the mark a running tick may re-claim; finish releases again
        pass
    return _release(cfg, ports, "as the stop began")


def finish(cfg: RetuneConfig, ports: Ports) -> list[str]:
    """The drain ended: release what a task claimed meanwhile, then clear the mark."""
    out = _release(cfg, ports, "after the drain")
    try:
        clear(ports.r, ports.identity)
    except redis.RedisError:
        pass
    return out


def _release(cfg: RetuneConfig, ports: Ports, when: str) -> list[str]:
    t = time.monotonic()
    out = control.release_all(cfg, ports)
    log.info("retune: %s released %s Lease(s) %s (%.2f s)", ports.identity, ", ".join(out) or "no", when,
             time.monotonic() - t)
    return out
