"""Sweep objectives: what a candidate is scored on, in which direction, and when it cannot be.

Scores are the replay summary's own figures: throughputs in output tokens/s, ``ttft`` the
mean TTFT in ms, ``e2eLatency`` the mean E2E latency in ms, goodput in requests/s meeting
the SLA. An objective that cannot be computed (no SLA for goodput, no completed request,
no latency sample) fails the candidate with a reason; it never scores 0 or infinity.
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import BaseModel, ConfigDict

from powerfleet.sim.policy import SLA
from powerfleet.sim.summary import ReplaySummary


class Objective(str, Enum):
    throughput = "throughput"
    throughputPerGpu = "throughputPerGpu"
    throughputPerUser = "throughputPerUser"
    ttft = "ttft"
    e2eLatency = "e2eLatency"
    goodput = "goodput"
    goodputPerGpu = "goodputPerGpu"


MAXIMIZE = "maximize"
MINIMIZE = "minimize"
DIRECTION: dict[Objective, str] = {
    Objective.throughput: MAXIMIZE,
    Objective.throughputPerGpu: MAXIMIZE,
    Objective.throughputPerUser: MAXIMIZE,
    Objective.ttft: MINIMIZE,
    Objective.e2eLatency: MINIMIZE,
    Objective.goodput: MAXIMIZE,
    Objective.goodputPerGpu: MAXIMIZE,
}
UNITS: dict[Objective, str] = {
    Objective.throughput: "output tokens/s",
    Objective.throughputPerGpu: "output tokens/s per GPU",
    Objective.throughputPerUser: "output tokens/s per request",
    Objective.ttft: "ms (mean TTFT)",
    Objective.e2eLatency: "ms (mean E2E)",
    Objective.goodput: "requests/s meeting the SLA",
    Objective.goodputPerGpu: "requests/s meeting the SLA per GPU",
}


def parse_objective(name: str) -> Objective:
    try:
        return Objective(name)
    except ValueError:
        names = ", ".join(o.value for o in Objective)
        raise ValueError(f"unknown objective {name!r} (choose one of: {names})") from None


class ScoreResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    ok: bool
    score: float | None = None
    reason: str | None = None


def _fail(reason: str) -> ScoreResult:
    return ScoreResult(ok=False, score=None, reason=reason)


def score(
    summary: ReplaySummary,
    objective: Objective | str,
    sla: SLA | None = None,
    gpus: int | None = None,
) -> ScoreResult:
    """Score one replay summary on an objective (``gpus`` defaults to the summary's)."""
    obj = parse_objective(objective) if isinstance(objective, str) else objective
    g = gpus if gpus is not None else summary.gpus
    if obj in (Objective.throughputPerGpu, Objective.goodputPerGpu) and not g:
        return _fail("no GPU count to divide by")
    if summary.completed == 0:
        return _fail("no request completed")
    value: float | None
    if obj is Objective.throughput:
        value = summary.throughput_tok_s if summary.duration_s > 0 else None
        why = "zero replay duration"
    elif obj is Objective.throughputPerGpu:
        value = summary.throughput_tok_s / g if summary.duration_s > 0 else None
        why = "zero replay duration"
    elif obj is Objective.throughputPerUser:
        value = summary.throughput_per_user_tok_s
        why = "no request with more than one output token"
    elif obj is Objective.ttft:
        value = summary.ttft_ms.mean
        why = "no TTFT samples"
    elif obj is Objective.e2eLatency:
        value = summary.e2e_ms.mean
        why = "no E2E samples"
    else:
        if summary.sla is None and sla is None:
            return _fail(f"objective {obj.value} needs an SLA (ttft_ms and itl_ms, or e2e_ms)")
        if summary.goodput_req_s is None:
            return _fail(f"objective {obj.value}: the replay was run without an SLA")
        value = summary.goodput_req_s if obj is Objective.goodput else summary.goodput_req_s / g
        why = ""
    if value is None:
        return _fail(why)
    if not math.isfinite(value):
        return _fail(f"score is not finite ({value})")
    return ScoreResult(ok=True, score=value)
