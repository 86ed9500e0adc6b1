"""Is a GPU's reported draw believable? The guard's sensor check, one period at a time (pure).

The guard trusts a measured draw only where it could be what the GPU draws. A reading is
*implausible*, and the GPU lost until it reads plausibly again (the guard then counts it at what it
can draw: the larger of its enforced limit and its safe cap, power/guard.py), when:

* ``unreadable``: the agent reports the GPU with no draw (NVML could not read it);
* ``zero``: the draw is below ``floor_w``, less than a GPU holding a pod ever draws (an idle H200
  draws about 70 W);
* ``stuck``: the draw has not changed for ``stuck_s`` while the rest of the group's reported draw
  moved by at least ``stuck_load_w`` (NVML's 1-second average never repeats to the milliwatt over
  seconds of changing load; a group whose load does not move may read the same, and is left alone).
  The rest of the group is compared only while the same number of its GPUs read (a GPU that stops
  reading moves the sum, not the load), and a GPU reading its enforced limit is not stuck: it is
  held at its cap, and counting it there is what the guard would do anyway.

``Track`` is what the guard remembers per GPU between periods for the third check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Fault = Literal["unreadable", "zero", "stuck"]


@dataclass(frozen=True)
class Track:
    """A GPU's reading and since when it has read exactly that; the range of the rest of the
    group's reported draw over the same time."""

    draw_w: float
    since: float
    lo_w: float
    hi_w: float
    peers: int = 0  # how many other GPUs of the group read when lo_w and hi_w began
    stuck: bool = False  # judged stuck: it stays so until its reading changes

    @classmethod
    def from_json(cls, data: Any) -> Track:
        return cls(float(data["draw_w"]), float(data["since"]), float(data["lo_w"]), float(data["hi_w"]),
                   int(data.get("peers", 0)), bool(data.get("stuck", False)))


def check(draws: Mapping[str, float | None], limits: Mapping[str, float | None], tracks: Mapping[str, Track],
          now: float, floor_w: float, stuck_s: float,
          stuck_load_w: float) -> tuple[dict[str, Fault], dict[str, Track]]:
    """The faults of this period's readings (GPU -> fault; a GPU absent reads plausibly) and the
    tracks for the next period. ``draws``: GPU -> reported draw (None: no draw in its report);
    ``limits``: GPU -> its enforced limit where reported. A GPU not in ``draws`` (its node silent)
    is neither judged nor tracked."""
    faults: dict[str, Fault] = {}
    out: dict[str, Track] = {}
    read = {g: d for g, d in draws.items() if d is not None and math.isfinite(d)}
    total = math.fsum(read.values())
    for gpu, d in sorted(draws.items()):
        if gpu not in read or d is None:
            faults[gpu] = "unreadable"
            continue
        if d < floor_w:
            faults[gpu] = "zero"
        others, peers = total - d, len(read) - 1
        t = tracks.get(gpu)
        if t is None or round(t.draw_w, 3) != round(d, 3):
            out[gpu] = Track(d, now, others, others, peers)
            continue
        if t.peers != peers:  # another GPU started or stopped reading: compare from here on
            t = Track(t.draw_w, t.since, others, others, peers, t.stuck)
        t = Track(t.draw_w, t.since, min(t.lo_w, others), max(t.hi_w, others), peers, t.stuck)
        limit = limits.get(gpu)
        at_cap = limit is not None and abs(d - limit) <= 1.0
        if t.stuck or (not at_cap and now - t.since >= stuck_s and t.hi_w - t.lo_w >= stuck_load_w):
            t = Track(t.draw_w, t.since, t.lo_w, t.hi_w, peers, True)
            faults.setdefault(gpu, "stuck")
        out[gpu] = t
    return faults, out
