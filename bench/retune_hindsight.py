"""The judge of bench/retune.py and the best fixed setting in hindsight (not a test).

**The judge.** Window i is replayed warmed by window i-1 under the setting that served
window i-1, and the setting in force from window i's start continues from that state
(``judged``). A setting that moved at the boundary therefore starts from the state its
predecessor left, as a live router does. Before (``as_if_served``, still printed beside it)
every setting was replayed warm under itself: the setting chosen on window 0 was judged on
window 1 as if it had served window 0 already, before it could have been chosen (6.5 % of its
lead over the loop's default on the synthetic construction's window 1), and so was every move
of the loop on the window after it.

**The bound** (issue 33 item 5). The best fixed setting in hindsight is searched on the
judge's own figure, the mean over the judged windows (1 to the end) of each window's mean
TTFT with the setting held from the start: every point of the live grid, then the live edge
search (``retune.grid.search_beyond`` with the loop's options) from the grid, and the settings
the comparison itself used (the default, the setting chosen once, every setting the loop
chose) with the same search around each. No fixed setting of that family has a lower mean, so
(c) over (d) is never a figure one of them beats (a setting outside the family may still do
better: the edge search is local). It costs one replay per window per setting (about 120).
"""

from __future__ import annotations

import multiprocessing
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from powerfleet.retune.decision import Candidate
from powerfleet.retune.grid import search_beyond
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.profile import default_profile
from powerfleet.sim.replay import prepare, start_simulation
from powerfleet.sim.summary import summarize
from powerfleet.sim.trace import TraceRequest

Measure = tuple[float, float, float]  # mean TTFT ms, p90 TTFT ms, mean ITL ms


def measure(reqs: Sequence[TraceRequest], workers: int, pol: RouterPolicy, win: tuple[float, float],
            switch: tuple[float, RouterPolicy] | None = None) -> Measure:
    """Replay ``win`` (warmed by the window before) under ``pol``; with ``switch`` = (t, new) the
    routers move to ``new`` at t seconds, the state carried over."""
    arr = prepare(list(reqs), seed=0, window=win)
    prof = default_profile()
    sim = start_simulation(arr, workers, pol, 0, profile=prof)
    if switch is not None:
        sim = sim.run(until=(switch[0] - win[0]) * 1000.0).fork(switch[1])
    s = summarize(sim.run().result(), arr.osl, workers=workers, gpus_per_worker=prof.gpus_per_replica,
                  window_ms=arr.window_ms, sla=None, policy=pol, seed=0, profile=prof.name, cap_fraction=1.0,
                  scored=arr.scored)
    return (s.ttft_ms.mean or float("nan"), s.ttft_ms.p90 or float("nan"), s.itl_ms.mean or float("nan"))


def judged(reqs: Sequence[TraceRequest], workers: int, before: RouterPolicy, now: RouterPolicy,
           win: tuple[float, float]) -> Measure:
    """Window ``win`` served by ``now``, after the window before it was served by ``before``."""
    if before == now:
        return measure(reqs, workers, now, win)
    return measure(reqs, workers, before, win, switch=(win[0], now))


_JOB: dict = {}


def _per_window(pol: RouterPolicy) -> list[float]:
    return [measure(_JOB["reqs"], _JOB["workers"], pol, w)[0] for w in _JOB["wins"]]


def hindsight_bound(reqs: Sequence[TraceRequest], live: dict, wins: list[tuple[float, float]], workers: int,
                    processes: int, also: Sequence[RouterPolicy]) -> tuple[RouterPolicy, list[float], int]:
    """(the best fixed setting over the judged windows ``wins[1:]``, its mean TTFT per judged
    window, how many settings were searched): the live grid, the live edge search on the
    judge's mean, and ``also``."""
    _JOB.update(reqs=list(reqs), workers=workers, wins=wins[1:])
    seen: dict[str, tuple[RouterPolicy, list[float]]] = {}
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=max(1, processes), mp_context=ctx) as ex:
        def score(pols: Sequence[RouterPolicy]) -> list[Candidate]:
            new = list({p.model_dump_json(): p for p in pols if p.model_dump_json() not in seen}.values())
            for p, per in zip(new, ex.map(_per_window, new)):
                seen[p.model_dump_json()] = (p, per)
            return [_candidate(*seen[p.model_dump_json()]) for p in pols]

        start = RouterPolicy()
        grid = live["grid"]
        # The loop's search from the grid, then the same search around each of the
        # comparison's own settings (held fixed too).
        search_beyond(grid.axes(start), score(grid.points(start)), live["objective"], score, live["search"])
        for seed in score(list(also)):
            search_beyond(grid.axes(start), [seed], live["objective"], score, live["search"])
    best, per = min(seen.values(), key=lambda v: statistics.fmean(v[1]))
    return best, per, len(seen)


def _candidate(p: RouterPolicy, per: list[float]) -> Candidate:
    return Candidate(params=p.model_dump(), score=statistics.fmean(per))


__all__ = ["Measure", "hindsight_bound", "judged", "measure"]
