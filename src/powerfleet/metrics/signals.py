"""Celery signal handlers that feed the metrics: ticks sent (beat), task outcomes (workers)."""

from __future__ import annotations

import time
from typing import Any

from celery import signals

from powerfleet.metrics.registry import LAST_TICK, TASK_OUTCOMES, TICKS_SENT


def install_tick_metrics(tick_tasks: dict[str, str]) -> None:
    """In beat: count each published tick and remember when it was sent."""
    family_by_task = {task: family for family, task in tick_tasks.items()}

    def on_publish(sender: Any = None, **kw: Any) -> None:
        family = family_by_task.get(sender or "")
        if family is not None:
            TICKS_SENT.labels(family=family).inc()
            LAST_TICK.labels(family=family).set(time.time())

    signals.before_task_publish.connect(on_publish, weak=False)


def install_outcome_metrics() -> None:
    def outcome(kind: str):  # type: ignore[no-untyped-def]
        def handler(sender: Any = None, **kw: Any) -> None:
            name = getattr(sender, "name", None) or getattr(kw.get("request"), "task", None) or "unknown"
            TASK_OUTCOMES.labels(task=name, outcome=kind).inc()
        return handler

    for sig, kind in ((signals.task_success, "success"), (signals.task_failure, "failure"),
                      (signals.task_retry, "retry"), (signals.task_revoked, "revoked")):
        sig.connect(outcome(kind), weak=False)
