"""NVIDIA Dynamo's own offline trace replay as a reference peer (optional extra ``[peer]``).

``ai-dynamo-runtime==1.6.1`` ships ``run_mocker_trace_replay``: Dynamo's real KV router in
front of its mocker workers, in simulated time. Given powerfleet's timing profile as an
NPZ table (``write_timing_table``) and the same KV size, its engine steps cost what
powerfleet's do, so the two replays differ only in the mechanisms each models.

Metric definitions are converted before comparing (``PeerRun`` / ``metrics``): both sides
are reduced from per-request records with the same formulas (mean TTFT; nearest-rank
percentiles, Dynamo's definition; block hit rate = prefix blocks reused / prompt blocks,
from Dynamo's ``reused_input_tokens`` / 512). Dynamo breaks equal-cost ties at random
without a seed: compare against the band of several runs.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerfleet.sim.disagg import DisaggSimulation, Pools
from powerfleet.sim.engine import EngineConfig, simulate
from powerfleet.sim.policy import RouterOptions, RouterPolicy
from powerfleet.sim.profile import TimingProfile, default_profile
from powerfleet.sim.replay import prepare
from powerfleet.sim.trace import TraceRequest, dumps_request

PEER_VERSION = "1.6.1"


def _quiet() -> None:
    # At its default level the peer logs one line per routing decision; it reads DYN_LOG
    # once, when its native module is first imported.
    os.environ.setdefault("DYN_LOG", "error")


def available() -> bool:
    """Whether the peer's wheel is importable."""
    _quiet()
    try:
        import dynamo._core  # noqa: F401
    except ImportError:
        return False
    return True


def write_timing_table(profile: TimingProfile, path: str | Path, max_tokens: int = 262_144) -> Path:
    """The profile as Dynamo's ``dynamo_profile`` NPZ: prefill time over new tokens (1-D) and
    decode step time over (active KV tokens, context length) (2-D, bilinear upstream).

    Prefill is tabulated every 64 tokens (the default profile is quadratic; linear
    interpolation between 64-token points is within 1e-4 ms of it). Decode in powerfleet's
    profiles depends on the batch's KV tokens, not on the context length, so both context
    columns are equal; for table profiles the batch axis is taken at batch 1.
    """
    import numpy as np

    isl = np.arange(0, max_tokens + 1, 64, dtype=np.float64)
    isl[0] = 1.0
    kv = np.linspace(0.0, 4_000_000.0, 201)
    ctx = np.array([1.0, 1_000_000.0])
    np.savez(
        path,
        prefill_isl=isl,
        prefill_ttft_ms=np.array([profile.prefill_ms(float(x)) for x in isl]),
        decode_active_kv_tokens=kv,
        decode_context_length=ctx,
        decode_itl=np.array([[profile.decode_ms(1, float(k)) for _ in ctx] for k in kv]),
    )
    return Path(path)


def nearest_rank(sorted_xs: list[float], q: float) -> float:
    """Dynamo's percentile: the value at rank ceil(q/100 * n) (1-based)."""
    if not sorted_xs:
        return math.nan
    k = max(1, math.ceil(q / 100.0 * len(sorted_xs)))
    return sorted_xs[min(k, len(sorted_xs)) - 1]


@dataclass(frozen=True)
class Metrics:
    """One replay reduced with the same definitions on both sides."""

    requests: int
    mean_ttft_ms: float
    p50_ttft_ms: float
    p90_ttft_ms: float
    block_hit_rate: float
    preemptions: int
    wall_s: float

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def metrics(ttft: list[float], hit_blocks: int, prompt_blocks: int, preemptions: int, wall_s: float) -> Metrics:
    xs = sorted(ttft)
    return Metrics(
        requests=len(xs),
        mean_ttft_ms=math.fsum(xs) / len(xs) if xs else math.nan,
        p50_ttft_ms=nearest_rank(xs, 50),
        p90_ttft_ms=nearest_rank(xs, 90),
        block_hit_rate=hit_blocks / prompt_blocks if prompt_blocks else math.nan,
        preemptions=preemptions,
        wall_s=wall_s,
    )


def router_config(policy: RouterPolicy, options: RouterOptions | None = None) -> Any:
    """Dynamo's ``KvRouterConfig`` with powerfleet's eight knobs and router options."""
    _quiet()
    from dynamo._core import KvRouterConfig

    o = options or RouterOptions()
    return KvRouterConfig(
        overlap_score_credit=policy.overlap_score_credit,
        overlap_score_credit_decay=policy.overlap_score_credit_decay,
        prefill_load_scale=policy.prefill_load_scale,
        router_temperature=policy.temperature,
        host_cache_hit_weight=policy.host_cache_hit_weight,
        disk_cache_hit_weight=policy.disk_cache_hit_weight,
        shared_cache_multiplier=policy.shared_cache_multiplier,
        decode_active_request_weight=policy.decode_active_request_weight,
        router_queue_threshold=o.router_queue_threshold,
        router_queue_policy=o.router_queue_policy,
        router_prefill_load_model=o.router_prefill_load_model,
        router_track_output_blocks=o.router_track_output_blocks,
    )


def run_peer(
    requests: Sequence[TraceRequest],
    workers: int,
    policy: RouterPolicy,
    *,
    table: str | Path,
    kv_blocks: int,
    options: RouterOptions | None = None,
    engine: EngineConfig | None = None,
    scored_from_ms: float = 0.0,
    pools: Pools | None = None,
) -> Metrics:
    """One Dynamo replay of ``requests`` (times as recorded); requests arriving before
    ``scored_from_ms`` (from the first one) are a warm-up and are not scored. ``pools``: a
    disaggregated replay (``workers`` is then ignored; both pools use ``table`` and
    ``kv_blocks``, the transfer the default profile's KV size over ``pools.kv_transfer_gb_s``)."""
    _quiet()
    from dynamo._core import run_mocker_trace_replay

    eng = engine or EngineConfig()
    o = options or RouterOptions()

    def args(**more: Any) -> dict[str, Any]:
        return {"engine": {
            "block_size": eng.block_tokens, "num_gpu_blocks": kv_blocks,
            "max_num_seqs": eng.max_num_seqs, "max_num_batched_tokens": eng.max_num_batched_tokens,
            "timing_model": {"type": "external", "provider": "dynamo_profile", "config": {"path": str(table)}},
            **more,
        }}

    if pools is None:
        layout: dict[str, Any] = {"extra_engine_args": args(), "num_workers": workers}
    else:
        link = {"kv_transfer_bytes_per_token": default_profile().kv_bytes_per_token,
                "kv_transfer_bandwidth": pools.kv_transfer_gb_s}  # GB/s (1e9 bytes), as ours
        layout = {"prefill_engine_args": args(worker_type="prefill", **link),
                  "decode_engine_args": args(worker_type="decode", **link),
                  "num_prefill_workers": pools.prefill_workers, "num_decode_workers": pools.decode_workers}
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "trace.jsonl"
        f.write_text("".join(dumps_request(r) + "\n" for r in requests))
        t = time.perf_counter()
        res = run_mocker_trace_replay(
            [str(f)], router_config=router_config(policy, o), router_mode="kv_router",
            trace_block_size=eng.block_tokens, capture_per_request=True, kv_event_lag_ms=o.kv_event_lag_ms or None,
            **layout,
        )
        wall = time.perf_counter() - t
    t0 = min((r.timestamp_ms for r in requests), default=0.0)
    nblocks = {}
    for r in requests:  # Dynamo's records carry no hash ids: match them by arrival and length
        nblocks.setdefault((round(r.timestamp_ms - t0, 3), r.input_length), []).append(len(r.hash_ids))
    ttft: list[float] = []
    hits = blocks = pre = 0
    for rec in res.per_request:
        key = (round(rec["arrival_time_ms"], 3), rec["input_length"])
        nb = nblocks[key].pop() if nblocks.get(key) else -(-rec["input_length"] // eng.block_tokens)
        if rec["arrival_time_ms"] < scored_from_ms or rec.get("ttft_ms") is None:
            continue
        ttft.append(rec["ttft_ms"])
        hits += min(rec["reused_input_tokens"] // eng.block_tokens, nb)
        blocks += nb
        pre += rec.get("readmission_count", 0) or 0
    return metrics(ttft, hits, blocks, pre, wall)


def run_ours(
    requests: Sequence[TraceRequest],
    workers: int,
    policy: RouterPolicy,
    *,
    options: RouterOptions | None = None,
    engine: EngineConfig | None = None,
    profile: TimingProfile | None = None,
    seed: int = 0,
    scored_from_ms: float = 0.0,
    pools: Pools | None = None,
) -> Metrics:
    """powerfleet's replay of the same requests, reduced with the same definitions (``pools``:
    the disaggregated replay)."""
    prof = profile or default_profile()
    t = time.perf_counter()
    arr = prepare(requests, seed=seed, warmup_s=0)
    if pools is None:
        res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, workers, policy, prof, engine or EngineConfig(),
                       seed * 2 + 1, router=options)
    else:
        res = DisaggSimulation(arr, pools, policy, seed, profile=prof, engine=engine, router=options).run().result()
    wall = time.perf_counter() - t
    ttft: list[float] = []
    hits = blocks = 0
    for i, a in enumerate(res.arrival_ms):
        if a < scored_from_ms or i in res.dropped or math.isnan(res.first_token_ms[i]):
            continue
        ttft.append(res.first_token_ms[i] - a)
        hits += res.hit_blocks[i]
        blocks += res.prompt_blocks[i]
    return metrics(ttft, hits, blocks, res.preemptions, wall)
