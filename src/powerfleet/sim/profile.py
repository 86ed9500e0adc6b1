"""Engine timing profiles and the GPU power-cap hook.

The default profile is Llama-3-70B, TP4, on H200 SXM (one replica = 4 GPUs), fitted to the
roofline table in shared/research/power_sim.md section 5 (BLIS / vllm-sr fleet-sim formulas,
MFU prefill 0.45, decode 0.30, bandwidth efficiency 0.80, cross-checked against Vidur):

* prefill 512 / 2k / 8k tokens = 44 / 167 / 693 ms  ->  ``3.5 + 0.078 n + 7.5e-7 n^2`` ms
  (n = new, uncached tokens in the batch; the fit is within 1 % at the three points);
* decode step at batch 1 / 32 / 128 with 2k context = 13.2 / 14.6 / 19.6 ms, which is linear
  in the active KV tokens: ``13.15 + 2.52e-5 * kv_tokens`` ms (memory bound);
* KV capacity 1.12 M tokens per replica (0.9 x HBM less weights).

A profile can also be loaded from a JSON file holding tables (see ``load_profile``).

The power-cap hook (``CapCurve``) follows power_sim.md section 6.2: with cap C, phase demand
D and static floor P0 = 0.12 TDP (all as fractions of the default TDP) the phase slows by
``((D - P0) / (C - P0)) ** (1 / alpha)`` once C < D; prefill draws the full TDP (alpha 1.7,
fitted to Splitwise's "70 % cap -> prefill x1.30, decode x1.00"), decode draws 380/700 W
(alpha 4.5) and falls off a cliff (x3) within 10 % of the minimum settable limit (200 W).
Engine step times are divided by the throughput fraction ``1 / slowdown``.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from powerfleet.sim.policy import first_error
from powerfleet.textinput import InputError, read_text


class _PrefillTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[float] = Field(min_length=2)
    ms: list[float] = Field(min_length=2)

    @model_validator(mode="after")
    def _check(self) -> _PrefillTable:
        if len(self.tokens) != len(self.ms):
            raise ValueError("prefill.tokens and prefill.ms must have the same length")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:])):
            raise ValueError("prefill.tokens must be strictly increasing")
        return self


class _DecodeTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch: list[float] = Field(min_length=1)
    kv_tokens: list[float] = Field(min_length=2)
    ms: list[list[float]]

    @model_validator(mode="after")
    def _check(self) -> _DecodeTable:
        if len(self.ms) != len(self.batch) or any(len(r) != len(self.kv_tokens) for r in self.ms):
            raise ValueError("decode.ms must be one row per batch value, one column per kv_tokens value")
        for name, axis in (("batch", self.batch), ("kv_tokens", self.kv_tokens)):
            if any(b <= a for a, b in zip(axis, axis[1:])):
                raise ValueError(f"decode.{name} must be strictly increasing")
        return self


class ProfileFile(BaseModel):
    """The JSON file format of a timing profile (tables, linearly interpolated)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    source: str = ""
    gpus_per_replica: int = Field(1, ge=1)
    kv_capacity_tokens: int = Field(gt=0)
    # Bytes of KV one token occupies on the whole replica (all layers, K and V): what a
    # disaggregated replay moves from a prefill to a decode worker (sim/disagg.py).
    kv_bytes_per_token: int | None = Field(None, gt=0)
    prefill: _PrefillTable
    decode: _DecodeTable


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation, extrapolating with the end segments."""
    i = bisect.bisect_right(xs, x) - 1
    if i < 0:
        i = 0
    elif i > len(xs) - 2:
        i = len(xs) - 2
    x0, x1 = xs[i], xs[i + 1]
    y0, y1 = ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class TimingProfile:
    """Step-time model of one worker replica.

    ``prefill_ms(n)``: time of the prefill part of a step with ``n`` new tokens.
    ``decode_ms(b, kv)``: time of a decode step for ``b`` sequences holding ``kv`` tokens.
    A mixed step costs the sum of both.
    """

    name: str
    source: str
    gpus_per_replica: int
    kv_capacity_tokens: int
    prefill_ms: Callable[[float], float]
    decode_ms: Callable[[int, float], float]
    decode_linear_in_kv: bool = False
    kv_bytes_per_token: int | None = None  # None: unknown (a disaggregated replay then refuses it)


DEFAULT_PROFILE_NAME = "h200-llama3-70b-tp4"


def default_profile() -> TimingProfile:
    def prefill_ms(n: float) -> float:
        return 3.5 + 0.078 * n + 7.5e-7 * n * n if n > 0 else 0.0

    def decode_ms(b: int, kv: float) -> float:
        return 13.15 + 2.52e-5 * kv

    return TimingProfile(
        name=DEFAULT_PROFILE_NAME,
        source=(
            "roofline fit, shared/research/power_sim.md section 5 (Llama-3-70B TP4 on H200 SXM: "
            "prefill 44/167/693 ms at 512/2k/8k tokens; decode 13.2/14.6/19.6 ms at batch "
            "1/32/128, 2k context; KV 1.12M tokens)"
        ),
        gpus_per_replica=4,
        kv_capacity_tokens=1_120_000,
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        decode_linear_in_kv=True,
        # Llama-3-70B in BF16: 80 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 320 KiB
        # (power_sim.md section 6.4)
        kv_bytes_per_token=327_680,
    )


def profile_from_spec(spec: ProfileFile) -> TimingProfile:
    ptok, pms = list(spec.prefill.tokens), list(spec.prefill.ms)
    batch, kvs, grid = list(spec.decode.batch), list(spec.decode.kv_tokens), [list(r) for r in spec.decode.ms]

    def prefill_ms(n: float) -> float:
        return max(_interp(ptok, pms, n), 0.0) if n > 0 else 0.0

    def decode_ms(b: int, kv: float) -> float:
        if len(batch) == 1:
            return max(_interp(kvs, grid[0], kv), 0.0)
        rows = [_interp(kvs, row, kv) for row in grid]
        return max(_interp(batch, rows, float(b)), 0.0)

    return TimingProfile(
        name=spec.name,
        source=spec.source,
        gpus_per_replica=spec.gpus_per_replica,
        kv_capacity_tokens=spec.kv_capacity_tokens,
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        kv_bytes_per_token=spec.kv_bytes_per_token,
    )


def load_profile(path: str | Path) -> TimingProfile:
    """Load a table profile from JSON; errors name the file and the field."""
    p = Path(path)
    try:
        # The one bounded reader (a profile of /dev/zero fails in one line instead of reading forever).
        raw: Any = json.loads(read_text(p))
    except InputError as exc:
        raise ValueError(f"profile: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile {str(p)!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        spec = ProfileFile.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"profile {str(p)!r}: {first_error(exc, 'profile')}") from None
    return profile_from_spec(spec)


@dataclass(frozen=True)
class CapCurve:
    """Throughput fraction of each phase against the power cap (fractions of default TDP)."""

    static_floor: float = 0.12
    prefill_demand: float = 1.0
    prefill_alpha: float = 1.7
    decode_demand: float = 380.0 / 700.0
    decode_alpha: float = 4.5
    min_limit: float = 200.0 / 700.0
    decode_cliff: float = 3.0

    def _slowdown(self, cap: float, demand: float, alpha: float) -> float:
        if cap >= demand:
            return 1.0
        head = cap - self.static_floor
        if head <= 0:
            return math.inf
        return ((demand - self.static_floor) / head) ** (1.0 / alpha)

    def prefill_throughput(self, cap_fraction: float) -> float:
        return 1.0 / self._slowdown(cap_fraction, self.prefill_demand, self.prefill_alpha)

    def decode_throughput(self, cap_fraction: float) -> float:
        s = self._slowdown(cap_fraction, self.decode_demand, self.decode_alpha)
        if cap_fraction < self.min_limit * 1.1:
            s *= self.decode_cliff
        return 1.0 / s


def validate_cap_fraction(cap_fraction: float, curve: CapCurve | None = None) -> float:
    curve = curve or CapCurve()
    if not (math.isfinite(cap_fraction) and curve.static_floor < cap_fraction <= 1.0):
        raise ValueError(f"cap fraction must be in ({curve.static_floor}, 1], got {cap_fraction}")
    return cap_fraction
