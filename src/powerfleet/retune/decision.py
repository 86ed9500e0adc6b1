"""The decision rule: rank candidates, compare the best with the probe, apply or keep.

* Only candidates that scored (``ok``) with a finite score rank; they are ranked best
  first in the objective's direction, ties kept in grid order (stable sort).
* Of the candidates tied with the best (equal score within float noise), the decision takes
  the one that moves the fewest parameters from the current settings (``least_change``), so
  a parameter that does not change the outcome keeps its value: a disaggregated sweep once
  moved the prefill load scale to 0.25 only because that copy came first in grid order.
* The best is applied only when it beats the probe (the current settings, replayed with
  the same random numbers) by more than ``min_improvement_pct`` percent of |probe score|.
* Every candidate's confidence is corrected for the search (``retune.selection``: a max-t
  threshold over all candidates scored, sign flips of the paired batches). With a guard that
  asks for a confidence, the best is taken among the candidates that reach it, so choosing
  the best of 108 cannot turn noise into a move; a candidate without a confidence (no batch
  scores, fewer than three pairs) never reaches it, whatever its mean.
  Equal scores keep the current settings; with a noise guard (the live harvest, `retune
  sweep` and the benches pass one), so do scores within float noise of the probe's. A probe that could not be scored keeps too:
  there is nothing to compare against.
* The decision records every candidate (ranked), the probe and the reason.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from powerfleet.retune.guard import NoiseGuard
from powerfleet.retune.objectives import DIRECTION, MAXIMIZE, UNITS, Objective, parse_objective
from powerfleet.retune.selection import MIN_PAIRS, maxt_confidence


class Candidate(BaseModel):
    """One scored grid point (``params``: all eight router parameters)."""

    model_config = ConfigDict(frozen=True)
    params: dict[str, Any]
    score: float | None = None
    ok: bool = True
    reason: str | None = None
    shard: int | None = None
    origin: Literal["grid", "search"] = "grid"  # a grid point, or found searching beyond its edge
    requests: int | None = None  # scored requests of the window
    batches: list[float | None] | None = None  # per-batch scores (paired across settings: CRN)

    def rankable(self) -> bool:
        return self.ok and self.score is not None and math.isfinite(self.score)


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)
    action: Literal["apply", "keep"]
    params: dict[str, Any]
    improvement_pct: float | None
    reason: str
    objective: str
    direction: str
    min_improvement_pct: float
    best: Candidate | None
    probe: Candidate
    ranked: list[Candidate]
    unranked: list[Candidate]
    confidence: float | None = None  # the best beats the probe: paired batches, corrected for the search
    runner_up_margin_pct: float | None = None  # best vs the second best, % of |probe score|
    requests: int | None = None  # scored requests in the window


# Scores this close are a tie (float noise, not a difference between replays).
TIE_REL = 1e-9
TIE_ABS = 1e-12


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def rank(candidates: list[Candidate], objective: Objective | str) -> list[Candidate]:
    """Rankable candidates, best first in the objective's direction; ties keep their order."""
    obj = parse_objective(objective) if isinstance(objective, str) else objective
    sign = 1.0 if DIRECTION[obj] == MAXIMIZE else -1.0
    return sorted(
        (c for c in candidates if c.rankable()),
        key=lambda c: -sign * float(c.score),  # type: ignore[arg-type]
    )


def _moved(params: dict[str, Any], current: dict[str, Any]) -> int:
    return sum(1 for k, v in params.items() if k not in current or not math.isclose(float(v), float(current[k])))


def least_change(order: list[Candidate], current: dict[str, Any]) -> Candidate:
    """Of the candidates that tie with the best (``order``: ranked, best first; equal score
    within float noise), the one that moves the fewest parameters from ``current``, then the
    best ranked: a parameter that does not change the outcome keeps its current value, so a
    tie never makes a move of its own."""
    top = float(order[0].score)  # type: ignore[arg-type]
    tied = [c for c in order
            if math.isclose(float(c.score), top, rel_tol=TIE_REL, abs_tol=TIE_ABS)]  # type: ignore[arg-type]
    return min(tied, key=lambda c: _moved(c.params, current))  # min keeps the first of equals


def _noise(guard: NoiseGuard | None, requests: int | None, conf: float | None, tie: bool, searched: int) -> str | None:
    """Why the guard refuses an apply (None: it does not). Any guard, even with its checks at
    0, refuses a gain within float noise of the probe (``tie``): rounding is not a move, and
    constant paired differences of a few ulps would pass the paired test with confidence 1."""
    if guard is None:
        return None
    if tie:
        return "its score is within float noise of the probe's (a tie)"
    if requests is not None and requests < guard.min_requests:
        return f"the window holds only {requests} requests (min_requests {guard.min_requests})"
    if guard.confidence > 0 and conf is None:
        return (f"it has no paired confidence (fewer than {MIN_PAIRS} complete batch pairs with the probe); "
                "the mean alone never moves a knob")
    if guard.confidence > 0 and conf < guard.confidence:  # type: ignore[operator]
        return (f"no candidate reaches confidence {guard.confidence:g} after the search's correction "
                f"(max-t over {searched} candidates; the best's is {conf:.3f})")
    return None


def decide(
    candidates: list[Candidate],
    probe: Candidate,
    objective: Objective | str,
    min_improvement_pct: float = 0.0,
    guard: NoiseGuard | None = None,
) -> Decision:
    obj = parse_objective(objective) if isinstance(objective, str) else objective
    if not (math.isfinite(min_improvement_pct) and min_improvement_pct >= 0):
        raise ValueError(f"min_improvement_pct must be a finite number >= 0, got {min_improvement_pct}")
    direction = DIRECTION[obj]
    sign = 1.0 if direction == MAXIMIZE else -1.0
    order = rank(candidates, obj)
    unranked = [c for c in candidates if not c.rankable()]
    common = dict(
        objective=obj.value,
        direction=direction,
        min_improvement_pct=min_improvement_pct,
        probe=probe,
        ranked=order,
        unranked=unranked,
    )
    if not probe.rankable():
        why = probe.reason or "score is not finite"
        return Decision(
            action="keep", params=probe.params, improvement_pct=None, best=order[0] if order else None,
            reason=f"keep: the probe (current settings) could not be scored: {why}", **common,
        )
    if not order:
        return Decision(
            action="keep", params=probe.params, improvement_pct=None, best=None,
            reason="keep: no candidate could be scored", **common,
        )
    confs = maxt_confidence([c.batches for c in order], probe.batches, direction == MAXIMIZE)
    conf_of = {id(c): x for c, x in zip(order, confs)}
    passing = [c for c, x in zip(order, confs) if guard is not None and guard.confidence > 0
               and x is not None and x >= guard.confidence]
    best = least_change(passing or order, probe.params)
    if best is not order[0]:
        order = [best] + [c for c in order if c is not best]
        common["ranked"] = order
    ps = float(probe.score)  # type: ignore[arg-type]
    bs = float(best.score)  # type: ignore[arg-type]
    gain = sign * (bs - ps)
    pct = gain / abs(ps) * 100.0 if ps != 0 else None
    threshold = min_improvement_pct / 100.0 * abs(ps)
    conf = conf_of[id(best)]
    common.update(confidence=conf, requests=probe.requests, runner_up_margin_pct=(
        sign * (bs - float(order[1].score)) / abs(ps) * 100.0 if len(order) > 1 and ps != 0 else None))  # type: ignore[arg-type]
    desc = f"best {_fmt(bs)} vs probe {_fmt(ps)} {UNITS[obj]} ({direction})"
    if pct is not None:
        desc += f", {pct:+.3f} %"
    if gain > threshold and gain > 0:
        noisy = _noise(guard, probe.requests, conf, math.isclose(bs, ps, rel_tol=TIE_REL, abs_tol=TIE_ABS), len(order))
        if noisy:
            return Decision(action="keep", params=probe.params, improvement_pct=pct, best=best,
                            reason=f"keep: {desc}, but {noisy}", **common)
        return Decision(
            action="apply", params=best.params, improvement_pct=pct, best=best,
            reason=f"apply: {desc} beats the probe by more than {_fmt(min_improvement_pct)} %"
            + (f" (confidence {conf:.3f})" if conf is not None else ""), **common,
        )
    if gain == 0:
        why = "ties the probe; keeping the current settings"
    elif gain < 0:
        why = "is worse than the probe"
    else:
        why = f"does not beat the probe by more than {_fmt(min_improvement_pct)} %"
    return Decision(
        action="keep", params=probe.params, improvement_pct=pct, best=best,
        reason=f"keep: {desc} {why}", **common,
    )
