"""Golden replay cases: the engine's outputs request for request, captured before the
engine was split into router / worker / cache modules (tests/sim/data/golden_replay.json.gz).

Run ``python -m tests.sim.golden`` to re-capture; only do that when a change of behaviour is
intended and documented. ``test_sim_golden.py`` replays every case and compares exactly.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

from powerfleet.sim.engine import EngineConfig, simulate
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.profile import default_profile
from powerfleet.sim.replay import prepare
from powerfleet.sim.trace import TraceRequest, read_trace

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "golden_replay.json.gz"

# name: (trace file in DATA, workers, policy, engine, kv blocks or None, seed, jitter_ms, max_run_steps)
SLICE_CASES: dict[str, tuple[str, int, dict[str, Any], dict[str, Any], int | None, int, float, int | None]] = {
    "conv-default-8": ("conversation_0_180.jsonl.gz", 8, {}, {}, None, 0, 0.0, None),
    "conv-blind-hot-8": ("conversation_0_180.jsonl.gz", 8,
                         {"overlap_score_credit": 0.0, "temperature": 0.5}, {}, None, 3, 1000.0, None),
    "conv-pressure-4": ("conversation_0_180.jsonl.gz", 4,
                        {"overlap_score_credit_decay": 1.0, "decode_active_request_weight": 2.0,
                         "prefill_load_scale": 4.0}, {"max_num_seqs": 16}, 300, 1, 0.0, None),
    "conv-tiers-4": ("conversation_0_180.jsonl.gz", 4,
                     {"temperature": 1.0, "shared_cache_multiplier": 0.5},
                     {"host_cache_blocks": 100, "disk_cache_blocks": 200, "shared_cache_blocks": 500},
                     200, 2, 0.0, None),
    "synth-default-8": ("synthetic_0_90.jsonl.gz", 8, {}, {}, None, 0, 0.0, None),
    "synth-small-2": ("synthetic_0_90.jsonl.gz", 2, {"prefill_load_scale": 0.5},
                      {"max_num_batched_tokens": 1024}, 150, 5, 200.0, None),
    "synth-steps-3": ("synthetic_0_90.jsonl.gz", 3, {"overlap_score_credit": 0.4}, {}, 400, 0, 0.0, 3),
    "tiny-hot-3": ("tiny_trace.jsonl", 3, {"temperature": 1.0, "overlap_score_credit": 0.6}, {}, None, 9, 700.0, None),
}
GENERATED = 40


def generated_trace(k: int) -> tuple[list[TraceRequest], dict[str, Any]]:
    """A small random trace and configuration; stable (pure-Python ``random`` with a seed)."""
    rnd = random.Random(1000 + k)
    t = 0.0
    reqs = []
    for _ in range(rnd.randint(1, 40)):
        t += rnd.choice([0.0, 0.0, 10.0, 300.0, 2000.0])
        prefix = rnd.randint(0, 4)
        own = rnd.randint(0, 5)
        hashes = tuple(range(prefix)) + tuple(rnd.randint(100, 10**6) for _ in range(own))
        isl = max(0, len(hashes) * 512 - rnd.randint(0, 511)) if hashes else 0
        reqs.append(TraceRequest(t, isl, rnd.randint(0, 80), hashes))
    cfg = {
        "workers": rnd.randint(1, 4),
        "policy": {
            "overlap_score_credit": rnd.choice([0.0, 0.5, 1.0]),
            "overlap_score_credit_decay": rnd.choice([0.0, 1.0]),
            "prefill_load_scale": rnd.choice([0.0, 1.0, 4.0]),
            "temperature": rnd.choice([0.0, 0.0, 0.7]),
            "decode_active_request_weight": rnd.choice([0.0, 8.0]),
        },
        "engine": {
            "max_num_seqs": rnd.choice([1, 2, 256]),
            "max_num_batched_tokens": rnd.choice([700, 1024, 8192]),
            "host_cache_blocks": (tier := rnd.choice([0, 0, 3])),
            "disk_cache_blocks": tier,
            "shared_cache_blocks": 2 * tier,
        },
        "blocks": rnd.choice([6, 12, 40, 10**6]),
        "seed": rnd.randint(0, 5),
        "jitter_ms": rnd.choice([0.0, 50.0, 500.0]),
        "max_run_steps": rnd.choice([None, None, 1, 4]),
    }
    return reqs, cfg


def _outputs(reqs: list[TraceRequest], workers: int, policy: dict[str, Any], engine: dict[str, Any],
             blocks: int | None, seed: int, jitter_ms: float, max_run_steps: int | None) -> dict[str, Any]:
    prof = default_profile()
    if blocks is not None:
        prof = dataclasses.replace(prof, kv_capacity_tokens=blocks * 512)
    arr = prepare(reqs, seed=seed, jitter_ms=jitter_ms)
    res = simulate(arr.arrival_ms, arr.isl, arr.osl, arr.hashes, workers, RouterPolicy(**policy), prof,
                   EngineConfig(**engine), seed * 2 + 1, max_run_steps=max_run_steps)
    nan = lambda xs: [None if math.isnan(x) else x for x in xs]  # noqa: E731  (JSON has no NaN)
    return {
        "first_token_ms": nan(res.first_token_ms),
        "finish_ms": nan(res.finish_ms),
        "worker": res.worker,
        "hit_blocks": res.hit_blocks,
        "prompt_blocks": res.prompt_blocks,
        "loaded_blocks": res.loaded_blocks,
        "dropped": {str(k): v for k, v in sorted(res.dropped.items())},
        "routed_per_worker": res.routed_per_worker,
    }


def case_names() -> list[str]:
    return list(SLICE_CASES) + [f"generated-{k}" for k in range(GENERATED)]


def run_case(name: str) -> dict[str, Any]:
    if name.startswith("generated-"):
        reqs, c = generated_trace(int(name.split("-")[1]))
        return _outputs(reqs, c["workers"], c["policy"], c["engine"], c["blocks"], c["seed"], c["jitter_ms"],
                        c["max_run_steps"])
    file, workers, pol, eng, blocks, seed, jitter, steps = SLICE_CASES[name]
    return _outputs(read_trace(DATA / file).requests, workers, pol, eng, blocks, seed, jitter, steps)


def load_golden() -> dict[str, Any]:
    with gzip.open(GOLDEN, "rt") as fh:
        return json.load(fh)


def capture() -> None:
    data = {name: run_case(name) for name in case_names()}
    with gzip.GzipFile(GOLDEN, "wb", mtime=0) as fh:
        fh.write(json.dumps(data, sort_keys=True).encode())


if __name__ == "__main__":
    capture()
