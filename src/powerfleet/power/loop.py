"""The guard's own clock: periods on fixed deadlines in one process (`powerfleet power guard`).

Under beat (``power.guard_runner: beat``) a guard period is a beat entry, a publish, a control
worker's fetch and a pool process's run: four processes' scheduling, each of which slips on a
loaded machine (issue 31 finding 5: 3 s excursions at load 8, when the bound is two 1 s periods).
Here one process keeps the periods itself: period k is due at ``start + k * period_s`` on the
monotonic clock, whatever the previous one took; a period that starts late runs at once; periods
missed entirely (the process was not scheduled for longer than a period) are skipped, not bunched,
and counted, so a slip is visible (a log line, ``powerfleet_power_guard_slipped_periods_total``)
rather than silent. Pure: the clock, the wait and the run are injected.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("powerfleet.power")


@dataclass
class Deadlines:
    """Period k is due at ``start + k * period_s``; ``after(now)`` is the next one not yet passed."""

    period_s: float
    start: float
    index: int = 0

    def due(self) -> float:
        return self.start + self.index * self.period_s

    def advance(self, now: float) -> int:
        """Move to the next period due after ``now``'s; return how many were missed on the way."""
        behind = math.floor((now - self.start) / self.period_s) if now > self.start else 0
        nxt = max(self.index + 1, behind + 1)
        missed = nxt - self.index - 1
        self.index = nxt
        return missed


@dataclass
class LoopStats:
    periods: int = 0
    missed: int = 0
    late: int = 0  # started more than half a period after its deadline
    max_lateness_s: float = 0.0


def run_periods(period_s: float, run: Callable[[], None], monotonic: Callable[[], float],
                wait: Callable[[float], bool], on_missed: Callable[[int, float], None] | None = None,
                max_periods: int | None = None) -> LoopStats:
    """Call ``run`` once per period on fixed deadlines until ``wait`` returns True (stop asked).

    ``wait(seconds)`` sleeps up to ``seconds`` and says whether to stop (``threading.Event.wait``).
    ``run`` must not raise (the caller keeps each group's failure to itself).
    ``on_missed(count, lateness_s)``: told when periods were skipped or one started late."""
    deadlines = Deadlines(period_s, monotonic())
    stats = LoopStats()
    while max_periods is None or stats.periods < max_periods:
        now = monotonic()
        if now < deadlines.due() and wait(deadlines.due() - now):
            break
        lateness = max(0.0, monotonic() - deadlines.due())
        stats.max_lateness_s = max(stats.max_lateness_s, lateness)
        run()
        stats.periods += 1
        missed = deadlines.advance(monotonic())
        stats.missed += missed
        late = lateness > period_s / 2
        stats.late += int(late)
        if (missed or late) and on_missed is not None:
            on_missed(missed, lateness)
        if wait(0):
            break
    return stats
