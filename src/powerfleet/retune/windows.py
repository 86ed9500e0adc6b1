"""Epoch-aligned retune windows, as pure functions.

Window k covers [phase + k*interval, phase + (k+1)*interval) in epoch seconds. Because the
windows depend only on (interval, phase) and the epoch, a restarted process, or a second
replica, computes the same windows; a launch is keyed by (deployment, k), so launching
window k twice is a no-op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    index: int
    start: float
    end: float


def _check(interval_s: float, phase_s: float) -> None:
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError(f"interval_s must be a positive finite number, got {interval_s!r}")
    if not (0 <= phase_s < interval_s):
        raise ValueError(f"phase_s must be in [0, interval_s), got {phase_s!r}")


def window_at(t: float, interval_s: float, phase_s: float = 0.0) -> Window:
    """The window containing epoch time t."""
    _check(interval_s, phase_s)
    k = math.floor((t - phase_s) / interval_s)
    return window(k, interval_s, phase_s)


def window(k: int, interval_s: float, phase_s: float = 0.0) -> Window:
    _check(interval_s, phase_s)
    start = phase_s + k * interval_s
    return Window(index=k, start=start, end=start + interval_s)


def last_closed_window(now: float, interval_s: float, phase_s: float = 0.0) -> Window:
    """The most recent window whose end is <= now."""
    return window(window_at(now, interval_s, phase_s).index - 1, interval_s, phase_s)


def first_launchable_index(enabled_at: float, interval_s: float, phase_s: float = 0.0) -> int:
    """The first window that may be launched after retune was enabled at ``enabled_at``.

    The window in progress at enable time holds traffic from before retune was on, so it
    is skipped: the first launchable window is the one after it.
    """
    return window_at(enabled_at, interval_s, phase_s).index + 1


def windows_to_launch(now: float, enabled_at: float, last_launched: int | None,
                      interval_s: float, phase_s: float = 0.0) -> list[Window]:
    """Closed windows not launched yet, oldest first; only the newest one is returned.

    A process that was down for several windows launches just the latest closed one:
    retuning on stale traffic is not useful, and a backlog would flood the sweep queue.
    """
    closed = last_closed_window(now, interval_s, phase_s)
    first = first_launchable_index(enabled_at, interval_s, phase_s)
    if closed.index < first:
        return []
    if last_launched is not None and closed.index <= last_launched:
        return []
    return [closed]


def dedupe_key(deployment: str, k: int) -> str:
    return f"powerfleet:retune:launched:{deployment}:{k}"
