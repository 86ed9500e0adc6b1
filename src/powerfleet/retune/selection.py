"""Selection-corrected confidence: a max-t threshold over the whole search (issue 33 item 2).

The sweep scores every candidate on the same paired batches as the probe (common random
numbers). Testing only the candidate already chosen for its mean is the winner's curse: with
the live grid of 108 candidates no better than the probe and 2-4 % per-batch noise, the
one-sided paired t test applied in 89-94 % of windows. This module corrects for the choice.

* Each candidate's statistic is the larger of two paired t statistics over its batch
  differences with the probe (the candidate's better side positive): a moderated t, whose
  variance is averaged with the median variance of all testable candidates (steadier than
  the 15-degree-of-freedom estimate when every candidate's noise is alike: the review's
  model), and the plain t (the stronger one when the candidates' variances differ widely, as
  in the synthetic trace's queueing windows: a candidate with 11.8 % batch spread beside
  near-ties with the probe). Taking the larger is one statistic, computed the same way for
  every flip, so the threshold below stays exact; it costs a little of either one's power.
* Its confidence is ``1 - p``, ``p`` the single-step max-t adjusted p-value (Westfall and
  Young): the share of sign flips of the batch differences, the same flip for every
  candidate at once (which keeps their correlation), whose *largest* statistic over all
  candidates reaches the candidate's observed one. Under the null (no candidate better than
  the probe) the chance that *any* candidate reaches 0.95 is at most 5 %, whatever the
  grid's size and correlation: choosing among the survivors cannot inflate it.
* Up to ``EXACT_MAX`` batches, every flip is enumerated; above, the identity and
  ``FLIPS - 1`` flips drawn from a fixed seed (deterministic: the same data gives the same
  confidence).
* A candidate with fewer than ``MIN_PAIRS`` complete pairs with the probe has no confidence
  (None) and never counts as better; it is left out of the maximum too.

Pure and deterministic; ``retune.decision.decide`` uses it when a guard asks for a confidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MIN_PAIRS = 3
EXACT_MAX = 11  # 2**11 = 2048 flips, enumerated
FLIPS = 2048
SEED = 0x5E1EC7


def _flips(n: int) -> np.ndarray:
    """Sign patterns (rows) over ``n`` batches; the first row is the identity."""
    if n <= EXACT_MAX:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
        return 1.0 - 2.0 * bits  # row 0: all +1
    rng = np.random.default_rng(SEED)
    s = rng.choice(np.array([-1.0, 1.0]), size=(FLIPS, n))
    s[0] = 1.0
    return s


def _diffs(cands: Sequence[Sequence[float | None] | None], probe: Sequence[float | None],
           maximize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(differences with missing pairs as 0, mask of complete pairs): candidates x batches."""
    n = len(probe)
    sign = 1.0 if maximize else -1.0
    d = np.zeros((len(cands), n))
    ok = np.zeros((len(cands), n), dtype=bool)
    for i, c in enumerate(cands):
        if not c or len(c) != n:
            continue
        for j, (x, p) in enumerate(zip(c, probe)):
            if x is not None and p is not None and math.isfinite(x) and math.isfinite(p):
                d[i, j], ok[i, j] = sign * (x - p), True
    return d, ok


def _stats(means: np.ndarray, sq: np.ndarray, cnt: np.ndarray, floor: float) -> np.ndarray:
    """Per candidate and flip (``means``: candidates x flips), the larger of its moderated t
    and its plain paired t (the same statistic for every flip, so the threshold stays exact)."""
    var = np.maximum(sq[:, None] - cnt[:, None] * means**2, 0.0) / (cnt[:, None] - 1)
    pooled = np.median(var, axis=0, keepdims=True)
    mod = np.maximum((var + pooled) / 2.0, floor)
    return np.maximum(means / np.sqrt(mod / cnt[:, None]), means / np.sqrt(np.maximum(var, floor) / cnt[:, None]))


def maxt_confidence(cands: Sequence[Sequence[float | None] | None], probe: Sequence[float | None] | None,
                    maximize: bool) -> list[float | None]:
    """Each candidate's selection-corrected confidence that it beats the probe (None: fewer
    than ``MIN_PAIRS`` complete pairs, or no probe batches)."""
    out: list[float | None] = [None] * len(cands)
    if not probe:
        return out
    d, ok = _diffs(cands, probe, maximize)
    cnt = ok.sum(axis=1)
    live = np.flatnonzero(cnt >= MIN_PAIRS)
    if live.size == 0:
        return out
    d, cnt = d[live], cnt[live].astype(float)
    scale = float(np.mean([abs(p) for p in probe if p is not None and math.isfinite(p)] or [1.0]))
    floor = (1e-9 * (scale or 1.0)) ** 2  # constant differences: a huge t, not a division by 0
    signs = _flips(d.shape[1])
    means = (d @ signs.T) / cnt[:, None]  # candidates x flips; column 0 is what was observed
    t = _stats(means, (d * d).sum(axis=1), cnt, floor)
    peak = np.sort(t.max(axis=0))  # the largest statistic of each flip, ascending
    observed = t[:, 0]
    # flips whose largest statistic reaches the observed one (within float noise)
    reach = peak.size - np.searchsorted(peak, observed - 1e-12 * np.maximum(1.0, np.abs(observed)), side="left")
    for i, r in zip(live, reach):
        out[int(i)] = 1.0 - int(r) / peak.size
    return out


__all__ = ["maxt_confidence", "MIN_PAIRS"]
