"""The what-if's figures: the JSON contract ``powerfleet.power.whatif/v1`` (docs/json-contracts.md)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from powerfleet.power.whatif import PRIORITIES, WhatIfRun
from powerfleet.sim.policy import SLA
from powerfleet.sim.summary import VersionedJson, percentile

WHATIF_SCHEMA = "powerfleet.power.whatif/v1"


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


class Pct(BaseModel):
    model_config = ConfigDict(frozen=True)
    p50: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, xs: list[float]) -> Pct:
        if not xs:
            return cls()
        s = sorted(xs)
        return cls(p50=_r(percentile(s, 50)), p99=_r(percentile(s, 99)))


class ClassFigures(BaseModel):
    model_config = ConfigDict(frozen=True)
    workers: int
    gpus: int
    requests: int
    completed: int
    goodput_rps: float
    ttft_ms: Pct
    itl_ms: Pct
    capped_gpu_time_fraction: float | None
    throttle_events: int


class Draw(BaseModel):
    model_config = ConfigDict(frozen=True)
    mean: float | None
    p99: float | None
    max: float | None


class Excursions(BaseModel):
    model_config = ConfigDict(frozen=True)
    count: int
    longest_s: int
    max_over_w: float


class Capped(BaseModel):
    model_config = ConfigDict(frozen=True)
    gpu_time_fraction: float
    events_per_gpu_hour: float


class Fallback(BaseModel):
    model_config = ConfigDict(frozen=True)
    activations: int
    longest_reaction_s: float | None


class WhatIfReport(VersionedJson):
    schema_: str = WHATIF_SCHEMA
    workers: int
    gpus: int
    gpus_per_worker: int
    limit_w: float
    requested_w: float
    oversubscription: float  # requested_w / limit_w
    cap_sum_gpus: int  # GPUs cap-sum budgeting admits under the limit at this cap
    load_scale: float
    duration_s: float
    requests: int
    completed: int
    sla: SLA | None
    goodput_rps: float
    ttft_ms: Pct
    itl_ms: Pct
    by_priority: dict[str, ClassFigures]
    draw_w: Draw
    excursions: Excursions
    capped: Capped
    fallback: Fallback
    telemetry_loss_s: list[float] | None
    faults: list[str] = []  # each --fault as KIND:GPUS:START:END
    guard: dict[str, Any]
    profile: str


def _latencies(run: WhatIfRun, prio: str, sla: SLA | None) -> tuple[list[float], list[float], int, int, int]:
    res = run.results.get(prio)
    if res is None:
        return [], [], 0, 0, 0
    dep = next(d for d in run.deployments if d.priority == prio)
    osl = dep.arrivals.osl
    ttft, itl = [], []
    good = done = 0
    for i, a in enumerate(res.arrival_ms):
        f = res.finish_ms[i]
        if i in res.dropped or math.isnan(f):
            continue
        done += 1
        ft = res.first_token_ms[i]
        tt = ft - a
        ttft.append(tt)
        il = (f - ft) / (osl[i] - 1) if osl[i] > 1 else None
        if il is not None:
            itl.append(il)
        if sla is None or sla.met(tt, il, f - a):
            good += 1
    return ttft, itl, good, done, len(res.arrival_ms)


def excursions(group_w: list[float], limit_w: float) -> Excursions:
    """Runs of consecutive 1-second bins above the limit: how many, the longest, the worst."""
    count = longest = run = 0
    worst = 0.0
    for w in group_w:
        if w > limit_w:
            run += 1
            worst = max(worst, w - limit_w)
            if run == 1:
                count += 1
            longest = max(longest, run)
        else:
            run = 0
    return Excursions(count=count, longest_s=longest, max_over_w=round(worst, 1))


def report(run: WhatIfRun) -> WhatIfReport:
    cfg = run.config
    tl = run.timeline
    g = cfg.gpus_per_worker
    window_s = max(tl.duration_s, 1e-9)
    span_s = run.deployments[0].arrivals.window_ms / 1000.0 or window_s  # the traffic's length
    all_ttft: list[float] = []
    all_itl: list[float] = []
    good_all = done_all = n_all = 0
    by: dict[str, ClassFigures] = {}
    for d in run.deployments:
        ttft, itl, good, done, n = _latencies(run, d.priority, cfg.sla)
        all_ttft += ttft
        all_itl += itl
        good_all += good
        done_all += done
        n_all += n
        gpu_ms = d.workers * g * window_s * 1000.0
        by[d.priority] = ClassFigures(
            workers=d.workers, gpus=d.workers * g, requests=n, completed=done, goodput_rps=round(good / span_s, 4),
            ttft_ms=Pct.of(ttft), itl_ms=Pct.of(itl),
            capped_gpu_time_fraction=_r(tl.capped_ms[d.priority] / gpu_ms, 4) if gpu_ms else None,
            throttle_events=tl.throttle_events[d.priority],
        )
    draws = sorted(tl.group_w)
    gpus = cfg.workers * g
    gpu_hours = gpus * window_s / 3600.0
    return WhatIfReport(
        workers=cfg.workers, gpus=gpus, gpus_per_worker=g, limit_w=cfg.limit_w, requested_w=run.requested_w,
        oversubscription=round(run.requested_w / cfg.limit_w, 4), cap_sum_gpus=int(cfg.limit_w // cfg.cap_w),
        load_scale=cfg.load_scale, duration_s=tl.duration_s, requests=n_all, completed=done_all, sla=cfg.sla,
        goodput_rps=round(good_all / span_s, 4), ttft_ms=Pct.of(all_ttft), itl_ms=Pct.of(all_itl),
        by_priority={p: by[p] for p in PRIORITIES},
        draw_w=Draw(mean=_r(math.fsum(draws) / len(draws), 1) if draws else None,
                    p99=_r(percentile(draws, 99), 1) if draws else None, max=_r(draws[-1], 1) if draws else None),
        excursions=excursions(tl.group_w, cfg.limit_w),
        capped=Capped(
            gpu_time_fraction=round(math.fsum(tl.capped_ms.values()) / (gpus * window_s * 1000.0), 4),
            events_per_gpu_hour=round(sum(tl.capping_events.values()) / gpu_hours, 3) if gpu_hours else 0.0,
        ),
        fallback=Fallback(activations=tl.fallback_activations,
                          longest_reaction_s=_r(max(tl.fallback_reactions_s)) if tl.fallback_reactions_s else None),
        telemetry_loss_s=list(cfg.telemetry_loss) if cfg.telemetry_loss else None,
        faults=[f.text() for f in cfg.faults],
        guard={"active": run.guarded, **cfg.guard.model_dump(), "actuation_s": cfg.actuation_s, "modes": dict(sorted(tl.modes.items()))},
        profile=run.profile,
    )
