"""Retune tasks: the tick that launches each closed, not-yet-launched window exactly once."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from powerfleet.beat.ticklog import TickLog
from powerfleet.retune.windows import dedupe_key, window, windows_to_launch
from powerfleet.tasks.base import NoArgs, TaskArgs, fleet_task
from powerfleet.tasks.ports import clock, fleet_redis

_ENABLED_AT = "powerfleet:retune:enabled_at"
_LAST_LAUNCHED = "powerfleet:retune:last_launched"


class WindowArgs(TaskArgs):
    dgd: str = Field(min_length=1, max_length=253)
    window: int


class RetuneTickResult(TaskArgs):
    at: float
    launched: list[WindowArgs]


class WindowResult(TaskArgs):
    dgd: str
    window: int
    start: float
    end: float


@fleet_task("powerfleet.retune.tick", NoArgs, acks_late=False)
def retune_tick(self: Any, params: NoArgs) -> RetuneTickResult:
    r = fleet_redis(self.app)
    now = clock.now()
    cfg = self.app.fleet_config.retune
    launched: list[WindowArgs] = []
    for dgd in cfg.deployments:
        # First sighting of a retune-enabled deployment fixes its enable time.
        r.hsetnx(_ENABLED_AT, dgd, repr(now))
        enabled_at = float(r.hget(_ENABLED_AT, dgd))
        last = r.hget(_LAST_LAUNCHED, dgd)
        due = windows_to_launch(now, enabled_at, int(last) if last is not None else None,
                                cfg.window_interval_s, cfg.window_phase_s)
        for w in due:
            # SET NX per (deployment, window): a second tick or a second beat cannot relaunch.
            if r.set(dedupe_key(dgd, w.index), repr(now), nx=True, ex=7 * 86400):
                self.app.send_task("powerfleet.retune.window", kwargs={"dgd": dgd, "window": w.index})
                launched.append(WindowArgs(dgd=dgd, window=w.index))
            r.hset(_LAST_LAUNCHED, dgd, w.index)
    detail = ", ".join(f"launched {x.dgd} window {x.window}" for x in launched) or "no closed window to launch"
    TickLog(r).record("retune", now, self.request.origin, detail)
    return RetuneTickResult(at=now, launched=launched)


@fleet_task("powerfleet.retune.window", WindowArgs, acks_late=True)
def retune_window(self: Any, params: WindowArgs) -> WindowResult:
    """Entry point of one retune window; the cut/sweep/harvest pipeline attaches here."""
    cfg = self.app.fleet_config.retune
    w = window(params.window, cfg.window_interval_s, cfg.window_phase_s)
    return WindowResult(dgd=params.dgd, window=w.index, start=w.start, end=w.end)
