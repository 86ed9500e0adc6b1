"""Change detection on a window's own trace: did the load step inside the span?

A setting chosen on the window before a load change serves the window after it; the loop
reacts inside that window only if it can tell, from the requests that arrived so far, that
the traffic is no longer what the last decision was scored on. This module answers that,
purely, from arrival times and prompt lengths:

* the span is cut into bins of ``bin_s`` seconds; two series per bin: requests (the arrival
  rate) and prompt tokens (rate x prompt length, what prefill has to serve);
* the split ``c`` (a bin boundary in the searched part, at least ``min_bins`` bins on each
  side) is where the standardised difference of the two sides' means peaks (CUSUM);
* it is a change when Welch's t on the per-bin values of the two sides reaches ``z`` and the
  after/before mean ratio is at least ``min_ratio`` or at most ``1/min_ratio``. The bin
  variances are the traffic's own, so bursty (overdispersed) traffic needs a larger step
  than Poisson arrivals would; of the two series the one with the larger |t| is reported.

Taking the best of many splits raises the chance that noise passes; ``z`` is set high
enough (5 by default) that steady traffic almost never does (tests/retune/test_shift.py),
while a rate step of half up or down over a minute or two does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShiftRule:
    bin_s: float = 10.0
    z: float = 5.0
    min_ratio: float = 1.25
    min_bins: int = 4


@dataclass(frozen=True)
class Shift:
    at_s: float  # where the new traffic begins (a bin boundary)
    series: str  # "requests" or "prompt tokens"
    ratio: float  # after / before (per-bin means)
    t: float  # Welch's t of the split

    def __str__(self) -> str:
        return f"{self.series} rate x{self.ratio:.2f} (t {self.t:+.1f})"


def _bins(times_s: Sequence[float], weights: Sequence[float], lo: float, n: int, width: float) -> list[float]:
    out = [0.0] * n
    for t, w in zip(times_s, weights):
        i = int((t - lo) // width)
        if 0 <= i < n:
            out[i] += w
    return out


def _welch(a: list[float], b: list[float], unit: float) -> float:
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    # A side with no spread (evenly spaced or no arrivals) still has counting noise: at least
    # the Poisson variance of its mean (in the series' unit: one request's weight), so a
    # regular or quiet span does not give an infinite t.
    va, vb = max(va, ma * unit, unit * unit), max(vb, mb * unit, unit * unit)
    return (mb - ma) / math.sqrt(va / na + vb / nb)


def _split(series: list[float], first: int, rule: ShiftRule, unit: float) -> tuple[int, float, float] | None:
    """The change's split index (bins before it vs from it on), its t and ratio; None if none.

    The split is placed where the standardised difference of means (the CUSUM statistic,
    |mean after - mean before| * sqrt(m (n - m) / n)) peaks, which locates a step better than
    the largest t; Welch's t at that split and the ratio then decide whether it is a change."""
    n = len(series)
    prefix = [0.0]
    for x in series:
        prefix.append(prefix[-1] + x)
    best, at = -1.0, -1
    for m in range(max(first, rule.min_bins), n - rule.min_bins + 1):
        mb, ma = prefix[m] / m, (prefix[n] - prefix[m]) / (n - m)
        stat = abs(ma - mb) * math.sqrt(m * (n - m) / n)
        if stat > best:
            best, at = stat, m
    if at < 0:
        return None
    mb, ma = prefix[at] / at, (prefix[n] - prefix[at]) / (n - at)
    if mb <= 0 and ma <= 0:
        return None
    ratio = ma / mb if mb > 0 else math.inf
    if not (ratio >= rule.min_ratio or ratio <= 1.0 / rule.min_ratio):
        return None
    t = _welch(series[:at], series[at:], unit)
    return (at, t, ratio) if abs(t) >= rule.z else None


def detect(times_s: Sequence[float], prompt_tokens: Sequence[int], lo: float, hi: float, search_from: float,
           rule: ShiftRule = ShiftRule()) -> Shift | None:
    """A load change in [lo, hi) beginning at or after ``search_from`` (None: none found).

    ``times_s``: arrival times in seconds, on the same clock as ``lo``/``hi``;
    ``prompt_tokens``: each request's prompt length. Only whole bins count: a partial last
    bin (the span does not divide evenly) is left out, as the bins before ``lo`` are."""
    if not (rule.bin_s > 0 and rule.z > 0 and rule.min_ratio > 1 and rule.min_bins >= 2):
        raise ValueError("shift rule: bin_s and z must be > 0, min_ratio > 1, min_bins >= 2")
    if len(times_s) != len(prompt_tokens):
        raise ValueError("times_s and prompt_tokens must have the same length")
    n = int(math.floor((hi - lo) / rule.bin_s + 1e-9))
    if n < 2 * rule.min_bins:
        return None
    first = max(0, int(math.ceil((search_from - lo) / rule.bin_s - 1e-9)))
    found: Shift | None = None
    tokens = [float(x) for x in prompt_tokens]
    mean_tokens = max(1.0, sum(tokens) / len(tokens)) if tokens else 1.0
    for name, w, unit in (("requests", [1.0] * len(times_s), 1.0), ("prompt tokens", tokens, mean_tokens)):
        got = _split(_bins(times_s, w, lo, n, rule.bin_s), first, rule, unit)
        if got is not None and (found is None or abs(got[1]) > abs(found.t)):
            found = Shift(at_s=lo + got[0] * rule.bin_s, series=name, ratio=got[2], t=got[1])
    return found


def restart_at(times_s: Sequence[float], prompt_tokens: Sequence[int], lo: float, hi: float, search_from: float,
               rule: ShiftRule, min_requests: int) -> Shift | None:
    """A change worth deciding on: ``detect``'s, when the new traffic since it (up to ``hi``)
    holds at least ``min_requests`` requests (the noise guard's minimum; fewer could not apply)."""
    found = detect(times_s, prompt_tokens, lo, hi, search_from, rule)
    if found is None:
        return None
    after = sum(1 for t in times_s if found.at_s <= t < hi)
    return found if after >= max(1, min_requests) else None


def change_inside(times_s: Sequence[float], prompt_tokens: Sequence[int], start: float, end: float,
                  lookback_s: float, rule: ShiftRule | None, min_requests: int) -> Shift | None:
    """The load change a window [start, end) should be scored from: one found in the span
    with ``lookback_s`` before it (the warm-up, the reference traffic), beginning after the
    window's start, with at least ``min_requests`` requests after it. None: score the whole
    window (no rule, no change, a change on the boundary, or too few requests since it).
    What the live window step (``live.launch_window``) and bench/retune.py both call."""
    if rule is None:
        return None
    found = restart_at(times_s, prompt_tokens, start - lookback_s, end, start, rule, min_requests)
    return found if found is not None and found.at_s > start else None


def scored_window(times_s: Sequence[float], prompt_tokens: Sequence[int], window: tuple[float, float],
                  lookback_s: float, rule: ShiftRule | None,
                  min_requests: int) -> tuple[tuple[float, float], float | None, Shift | None]:
    """``run_sweep``'s ``window`` and ``warmup_s`` for a window scored as the live step scores
    it: from a change inside it (the warm-up then reaches back ``lookback_s`` before the
    window's start), else the whole window with the default warm-up (None)."""
    found = change_inside(times_s, prompt_tokens, window[0], window[1], lookback_s, rule, min_requests)
    if found is None:
        return window, None, None
    return (found.at_s, window[1]), found.at_s - window[0] + lookback_s, found
