"""Typed public inputs of a replay: the router policy and the SLA.

Defaults follow Dynamo's ``KvRouterConfig::default`` (lib/kv-router/src/scheduling/config.rs,
see shared/research/dynamo.md section 3.3): credit 1.0, prefill load scale 1.0, temperature 0,
host/disk cache-hit weights 0.75/0.25, shared-cache multiplier 0. The decay and the decode
active-request weight are 0 (their defaults were not visible upstream; 0 turns them off).
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

POLICY_FIELDS = (
    "overlap_score_credit",
    "overlap_score_credit_decay",
    "prefill_load_scale",
    "temperature",
    "host_cache_hit_weight",
    "disk_cache_hit_weight",
    "shared_cache_multiplier",
    "decode_active_request_weight",
)
SEARCHED_KNOBS = ("overlap_score_credit", "prefill_load_scale", "temperature")


class RouterPolicy(BaseModel):
    """The eight router cost parameters (units: KV blocks)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    overlap_score_credit: float = Field(1.0, ge=0.0, le=1.0)
    overlap_score_credit_decay: float = Field(0.0, ge=0.0)
    prefill_load_scale: float = Field(1.0, ge=0.0)
    temperature: float = Field(0.0, ge=0.0)
    host_cache_hit_weight: float = 0.75
    disk_cache_hit_weight: float = 0.25
    shared_cache_multiplier: float = Field(0.0, ge=0.0, le=1.0)
    decode_active_request_weight: float = Field(0.0, ge=0.0)


class SLA(BaseModel):
    """Goodput SLA: either ``ttft_ms`` and ``itl_ms`` together, or ``e2e_ms``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    ttft_ms: float | None = Field(None, gt=0)
    itl_ms: float | None = Field(None, gt=0)
    e2e_ms: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_form(self) -> SLA:
        pair = (self.ttft_ms is not None, self.itl_ms is not None)
        if self.e2e_ms is not None:
            if any(pair):
                raise ValueError("give either e2e_ms, or ttft_ms and itl_ms, not both")
        elif pair != (True, True):
            raise ValueError("give both ttft_ms and itl_ms (or e2e_ms alone)")
        return self

    def met(self, ttft_ms: float, itl_ms: float | None, e2e_ms: float) -> bool:
        if self.e2e_ms is not None:
            return e2e_ms <= self.e2e_ms
        assert self.ttft_ms is not None and self.itl_ms is not None
        return ttft_ms <= self.ttft_ms and (itl_ms is None or itl_ms <= self.itl_ms)


def error_location(exc: ValidationError, default: str = "value") -> tuple[str, str]:
    """(dotted field path, message) of the first error pydantic found."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or default
    return loc, str(err.get("msg", "invalid"))


def first_error(exc: ValidationError, default: str = "value") -> str:
    """``field: message`` of the first error, for one-line error reports."""
    loc, msg = error_location(exc, default)
    return f"{loc}: {msg}"


def load_json_object(text: str, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be a JSON object")
    return obj


def parse_policy(text_or_obj: str | dict[str, Any] | None, base: RouterPolicy | None = None) -> RouterPolicy:
    """A policy from JSON holding any subset of the eight fields; the rest from ``base``/defaults."""
    if text_or_obj is None:
        return base or RouterPolicy()
    obj = load_json_object(text_or_obj, "policy") if isinstance(text_or_obj, str) else dict(text_or_obj)
    for k, v in obj.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"policy {k}: must be finite")
    merged = (base or RouterPolicy()).model_dump() | obj
    try:
        return RouterPolicy.model_validate(merged)
    except ValidationError as exc:
        raise ValueError(f"policy {first_error(exc)}") from None


def parse_sla(text_or_obj: str | dict[str, Any] | None) -> SLA | None:
    if text_or_obj is None:
        return None
    obj = load_json_object(text_or_obj, "SLA") if isinstance(text_or_obj, str) else dict(text_or_obj)
    try:
        return SLA.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(f"SLA {first_error(exc)}") from None
