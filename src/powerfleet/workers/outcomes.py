"""What Flower shows of a task's result: a skipped pass or window reads as one, and ticks are easy to find.

A node pass that changed nothing because the pod list or NVML failed, or a retune window that
was abandoned, returns normally: Celery records SUCCESS and Flower paints it green, so
"Failed 0" would mislead. Raising instead would turn an expected, reported condition into a
FAILURE with a traceback (and a retry policy question); the fleet keeps SUCCESS and puts the
verdict first in the result instead, which Flower shows in its result column:

- ``"summary": "skipped: <reason>"`` for a result that did nothing because of a failure
  (an agent pass with ``skipped`` set; a retune step whose ``status`` is one of SKIPPED_STATUSES);
  Flower's search ``result:skipped:`` lists them;
- ``"summary": "fleet-tick <family>"`` for the three beat ticks; Flower's search
  ``result:fleet-tick`` lists them apart from the per-node tasks they fan out.

Every other result is returned unchanged.
"""

from __future__ import annotations

from typing import Any

from celery import Task

from powerfleet.broker.outage import REDIS_UNREACHABLE_ERRORS, RedisUnreachable, unreachable
from powerfleet.queues import TICK_FAMILIES

TICK_PREFIX = "fleet-tick"
SKIPPED_PREFIX = "skipped:"
# Retune outcomes that mean "this window or step did nothing because something failed";
# not-leader, already-decided, resent, waiting, busy and no-traffic are normal answers.
# "unknown": an operator verb for a deployment retune does not know, a harvest of a sweep that is not there.
SKIPPED_STATUSES = frozenset({"abandoned", "blocked", "dropped", "invalid-settings", "failed", "unknown"})


def summarised(task_name: str, result: Any, tick_families: dict[str, str]) -> Any:
    """``result`` with a leading ``summary`` when it is a tick or was skipped (see the module doc)."""
    if not isinstance(result, dict) or "summary" in result:
        return result
    reason = _skipped_reason(result)
    if reason is not None:
        return {"summary": f"{SKIPPED_PREFIX} {reason}", **result}
    family = next((f for f, name in tick_families.items() if name == task_name), None)
    if family is not None:
        return {"summary": f"{TICK_PREFIX} {family}", **result}
    return result


def _skipped_reason(result: dict[str, Any]) -> str | None:
    skipped = result.get("skipped")
    if isinstance(skipped, str) and skipped:
        return " ".join(skipped.split())
    status = result.get("status")
    if isinstance(status, str) and status in SKIPPED_STATUSES:
        why = result.get("reason") or result.get("error") or ", ".join(map(str, result.get("premises") or ()))
        return f"{status}" + (f": {' '.join(str(why).split())}" if why else "")
    return None


class FleetTask(Task):
    """The base of every task of the fleet's app: results pass through ``summarised`` once, and a
    body that loses the broker's Redis mid-task fails in one line (broker/outage.py)."""

    # Expected: Celery records FAILURE and logs it without a traceback.
    throws = (RedisUnreachable,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = super().__call__(*args, **kwargs)
        except REDIS_UNREACHABLE_ERRORS as exc:
            raise unreachable(self.name, exc) from None
        return summarised(self.name, result, TICK_FAMILIES)
