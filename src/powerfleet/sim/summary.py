"""The replay summary: the JSON contract ``powerfleet.sim.replay/v1`` (docs/json-contracts.md)."""

from __future__ import annotations

import math
from itertools import compress
from typing import Any

from pydantic import BaseModel, ConfigDict

from powerfleet.sim.engine import EngineResult
from powerfleet.sim.policy import SLA, RouterPolicy

REPLAY_SCHEMA = "powerfleet.sim.replay/v1"
_DIGITS = 6


def _r(x: float) -> float:
    return round(float(x), _DIGITS)


class Stats(BaseModel):
    """mean, p50, p90, p99 of a latency (ms); all null when there are no samples."""

    model_config = ConfigDict(frozen=True)
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    count: int = 0

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        if not values:
            return cls()
        xs = sorted(values)
        return cls(
            mean=_r(math.fsum(xs) / len(xs)),
            p50=_r(percentile(xs, 50)),
            p90=_r(percentile(xs, 90)),
            p99=_r(percentile(xs, 99)),
            count=len(xs),
        )


def percentile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method) of sorted values."""
    n = len(sorted_xs)
    if n == 1:
        return sorted_xs[0]
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * frac


class VersionedJson(BaseModel):
    """A public JSON contract: ``schema_`` is written out as ``schema`` (name/version)."""

    model_config = ConfigDict(frozen=True)
    schema_: str

    def to_json_dict(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        d["schema"] = d.pop("schema_")
        return d


class ReplaySummary(VersionedJson):
    """What one replay measured. Times in ms, durations in s, throughputs in output tokens/s."""

    schema_: str = REPLAY_SCHEMA
    requests: int
    completed: int
    dropped: int
    dropped_reasons: dict[str, int]
    duration_s: float
    window_s: float
    workers: int
    gpus: int
    output_tokens: int
    throughput_tok_s: float
    throughput_per_gpu_tok_s: float
    throughput_per_user_tok_s: float | None
    ttft_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    cache_hit_rate: float | None
    offload_hit_rate: float | None
    sla: SLA | None
    goodput_requests: int | None
    goodput_req_s: float | None
    goodput_per_gpu_req_s: float | None
    load_imbalance: float | None
    requests_per_worker: list[int]
    policy: RouterPolicy
    seed: int
    profile: str
    cap_fraction: float


def summarize(
    res: EngineResult,
    osls: list[int],
    *,
    workers: int,
    gpus_per_worker: int,
    window_ms: float,
    sla: SLA | None,
    policy: RouterPolicy,
    seed: int,
    profile: str,
    cap_fraction: float,
    scored: tuple[bool, ...] | None = None,
) -> ReplaySummary:
    """Summarise the requests marked ``scored`` (all when None; warm-up ones are not)."""
    n = len(res.arrival_ms)
    idx = range(n) if scored is None else list(compress(range(n), scored))
    ttft: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    per_user: list[float] = []
    out_tokens = 0
    good = 0
    t_first = math.inf
    t_last = -math.inf
    hits = 0
    loaded = 0
    blocks = 0
    for i in idx:
        a = res.arrival_ms[i]
        if a < t_first:
            t_first = a
        f = res.finish_ms[i]
        if i in res.dropped or math.isnan(f):
            continue
        ft = res.first_token_ms[i]
        tt = ft - a
        ee = f - a
        ttft.append(tt)
        e2e.append(ee)
        o = osls[i]
        out_tokens += o
        il: float | None = None
        if o > 1:
            il = (f - ft) / (o - 1)
            itl.append(il)
            if f > ft:
                per_user.append((o - 1) * 1000.0 / (f - ft))
        if f > t_last:
            t_last = f
        if sla is not None and sla.met(tt, il, ee):
            good += 1
        hits += res.hit_blocks[i]
        loaded += res.loaded_blocks[i]
        blocks += res.prompt_blocks[i]
    completed = len(e2e)
    duration_s = (t_last - t_first) / 1000.0 if completed else 0.0
    gpus = workers * gpus_per_worker
    thr = out_tokens / duration_s if duration_s > 0 else 0.0
    win_s = window_ms / 1000.0 if window_ms > 0 else duration_s
    goodput = None
    if sla is not None:
        goodput = good / win_s if win_s > 0 else 0.0
    reasons: dict[str, int] = {}
    for i, why in res.dropped.items():
        if scored is None or scored[i]:
            reasons[why] = reasons.get(why, 0) + 1
    routed = res.routed_per_worker
    if scored is not None:
        routed = [0] * workers
        for i in idx:
            if res.worker[i] >= 0:
                routed[res.worker[i]] += 1
    mean_routed = sum(routed) / len(routed) if routed else 0.0
    return ReplaySummary(
        requests=len(idx),
        completed=completed,
        dropped=sum(reasons.values()),
        dropped_reasons=dict(sorted(reasons.items())),
        duration_s=_r(duration_s),
        window_s=_r(win_s),
        workers=workers,
        gpus=gpus,
        output_tokens=out_tokens,
        throughput_tok_s=_r(thr),
        throughput_per_gpu_tok_s=_r(thr / gpus) if gpus else 0.0,
        throughput_per_user_tok_s=_r(math.fsum(per_user) / len(per_user)) if per_user else None,
        ttft_ms=Stats.of(ttft),
        itl_ms=Stats.of(itl),
        e2e_ms=Stats.of(e2e),
        cache_hit_rate=_r(hits / blocks) if blocks else None,
        offload_hit_rate=_r(loaded / blocks) if blocks else None,
        sla=sla,
        goodput_requests=good if sla is not None else None,
        goodput_req_s=_r(goodput) if goodput is not None else None,
        goodput_per_gpu_req_s=_r(goodput / gpus) if goodput is not None and gpus else None,
        load_imbalance=_r(max(routed) / mean_routed) if mean_routed > 0 else None,
        requests_per_worker=list(routed),
        policy=policy,
        seed=seed,
        profile=profile,
        cap_fraction=cap_fraction,
    )
