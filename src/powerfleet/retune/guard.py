"""The noise guard: a decision that noise cannot make.

A window's best candidate beats the probe on its mean score by chance more often than one
would like: 60 s windows of 150-250 requests flapped A -> B -> A on predicted gains of 1-2 %.
Three checks stand between a sweep and a router write:

* **enough traffic**: the window must hold ``min_requests`` scored requests;
* **a paired test corrected for the search**: candidates and probe replay the same requests
  with the same random numbers, so their scores pair batch by batch
  (``sim.replay.replay_batches``: the scored requests cut into consecutive batches by
  arrival). The candidate applied must reach ``confidence`` under a max-t threshold over
  every candidate of the sweep (``retune.selection``), not only a t test of the one chosen
  for its mean; the mean alone is never enough (no batches, or fewer than three pairs:
  no confidence, no move);
* **dwell**: a parameter that moved may not move back (the opposite direction) within
  ``dwell_windows`` windows of that move. The fleet configures it as a time
  (``retune.dwell_s``, 60 s) and ``settings.resolve`` turns it into whole windows: short
  windows hold few requests each, so their noise is larger and one of them says little,
  and a knob is held for several (20 s windows: 3, the demo's 10 s: 6); a 300 s window
  holds ten times the traffic of a 30 s one and the max-t rule already bounds a false move,
  so it is not held at all (holding it cost -9.4 % on the synthetic trace's third
  300 s window, where the traffic really had moved; docs/retune.md).

And with any guard, even with those checks at 0, a best scoring within float noise of the
probe is a tie, never a move (``decision._noise``).

Pure functions; the harvest applies them (``retune.decision.decide`` takes the guard).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class NoiseGuard:
    min_requests: int = 200
    confidence: float = 0.95
    dwell_windows: int = 3


OFF = NoiseGuard(min_requests=0, confidence=0.0, dwell_windows=0)


@dataclass(frozen=True)
class Move:
    window: int
    previous: float  # the value before the move


def dwell_blocks(moves: Mapping[str, Move], current: Mapping[str, float], new: Mapping[str, float], k: int,
                 dwell_windows: int) -> str | None:
    """Why applying ``new`` over ``current`` at window ``k`` would move a parameter back too
    soon (None: it would not)."""
    for p, v in sorted(new.items()):
        cur = current.get(p)
        m = moves.get(p)
        if cur is None or m is None or math.isclose(v, cur) or k - m.window > dwell_windows:
            continue
        if (v - cur) * (cur - m.previous) < 0:
            return (f"{p} moved at window {m.window} ({m.previous:g} -> {cur:g}); moving it back to {v:g} waits "
                    f"{dwell_windows} windows")
    return None
