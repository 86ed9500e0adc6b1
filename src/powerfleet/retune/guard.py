"""The noise guard: a decision that noise cannot make.

A window's best candidate beats the probe on its mean score by chance more often than one
would like: 60 s windows of 150-250 requests flapped A -> B -> A on predicted gains of 1-2 %.
Three checks stand between a sweep and a router write:

* **enough traffic**: the window must hold ``min_requests`` scored requests;
* **a paired test**: candidate and probe replay the same requests with the same random
  numbers, so their scores pair batch by batch (``sim.replay.replay_batches``: the scored
  requests cut into consecutive batches by arrival). The one-sided Student t test on the
  per-batch differences must give the candidate the better side with at least
  ``confidence``; the mean alone is not enough;
* **dwell**: a parameter that moved may not move back (the opposite direction) within
  ``dwell_windows`` windows of that move.

And with any guard, even with those checks at 0, a best scoring within float noise of the
probe is a tie, never a move (``decision._noise``).

Pure functions; the harvest applies them (``retune.decision.decide`` takes the guard).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NoiseGuard:
    min_requests: int = 200
    confidence: float = 0.95
    dwell_windows: int = 3


OFF = NoiseGuard(min_requests=0, confidence=0.0, dwell_windows=0)


def t_cdf(t: float, dof: int) -> float:
    """P(T <= t) for Student's t with ``dof`` degrees of freedom (Simpson's rule on the
    density; accurate to about 1e-7 for the batch counts used here)."""
    if dof < 1:
        raise ValueError("dof must be >= 1")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    x = min(abs(t), 60.0)
    c = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)
    n = 400  # even

    def pdf(u: float) -> float:
        return c * (1 + u * u / dof) ** (-(dof + 1) / 2)

    h = x / n
    area = pdf(0) + pdf(x) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n))
    half = min(0.5, area * h / 3)
    return 0.5 + half if t >= 0 else 0.5 - half


def paired_confidence(cand: Sequence[float | None] | None, probe: Sequence[float | None] | None,
                      maximize: bool) -> float | None:
    """Confidence that the candidate is better than the probe, from paired batch scores;
    None when there are fewer than three complete pairs."""
    if not cand or not probe or len(cand) != len(probe):
        return None
    sign = 1.0 if maximize else -1.0
    d = [sign * (c - p) for c, p in zip(cand, probe) if c is not None and p is not None
         and math.isfinite(c) and math.isfinite(p)]
    n = len(d)
    if n < 3:
        return None
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    if var == 0:
        return 1.0 if mean > 0 else (0.5 if mean == 0 else 0.0)
    return t_cdf(mean / math.sqrt(var / n), n - 1)


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
