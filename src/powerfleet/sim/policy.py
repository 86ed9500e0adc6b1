"""Typed public inputs of a replay: the router policy and the SLA.

Defaults follow Dynamo's ``KvRouterConfig::default`` (lib/kv-router/src/scheduling/config.rs,
see shared/research/dynamo.md section 3.3): credit 1.0, prefill load scale 1.0, temperature 0,
host/disk cache-hit weights 0.75/0.25, shared-cache multiplier 0. The decay and the decode
active-request weight are 0 (their defaults were not visible upstream; 0 turns them off).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

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

    # Dynamo 1.6.1 accepts any finite credit >= 0: above 1 a cached block counts for more
    # than one uncached block (its --agentic preset uses 2).
    overlap_score_credit: float = Field(1.0, ge=0.0)
    overlap_score_credit_decay: float = Field(0.0, ge=0.0)
    prefill_load_scale: float = Field(1.0, ge=0.0)
    temperature: float = Field(0.0, ge=0.0)
    host_cache_hit_weight: float = 0.75
    disk_cache_hit_weight: float = 0.25
    shared_cache_multiplier: float = Field(0.0, ge=0.0, le=1.0)
    decode_active_request_weight: float = Field(0.0, ge=0.0)


class RouterOptions(BaseModel):
    """Dynamo router options beyond the eight cost knobs (same names, same meaning); every
    default is Dynamo 1.6.1's ``KvRouterConfig`` default and turns the mechanism off.

    * ``router_queue_threshold``: hold arrivals in a router queue while every worker's
      pending prefill tokens exceed this fraction of ``max_num_batched_tokens``; release
      them, in ``router_queue_policy`` order, as prefills complete (None: no queue).
    * ``router_queue_policy``: ``fcfs`` (oldest first), ``lcfs`` (newest first) or ``wspt``
      (shortest prompt first; Smith's rule with equal weights).
    * ``router_prefill_load_model``: ``none`` (a prompt counts in full until its prefill
      completes) or ``ais`` (the oldest pending prompt of a worker decays linearly over its
      predicted prefill time, from the time it became the oldest).
    * ``kv_event_lag_ms``: the router sees blocks stored and evicted this much later.
    * ``router_track_output_blocks``: count a placeholder block per 512 tokens generated.
    * ``router_tie_break``: equal costs go to the lowest index (``lowest``, powerfleet's
      historical rule) or to a uniform pick from the router's seeded stream (``random``,
      as Dynamo does, unseeded, at temperature 0).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    router_queue_threshold: float | None = Field(None, gt=0)
    router_queue_policy: Literal["fcfs", "lcfs", "wspt"] = "fcfs"
    router_prefill_load_model: Literal["none", "ais"] = "none"
    kv_event_lag_ms: float = Field(0.0, ge=0)
    router_track_output_blocks: bool = False
    router_tie_break: Literal["lowest", "random"] = "lowest"


def parse_router_options(text_or_obj: str | dict[str, Any] | None, what: str = "router") -> RouterOptions:
    """Router options from JSON (any subset); errors name ``what`` and the field."""
    if text_or_obj is None:
        return RouterOptions()
    obj = load_json_object(text_or_obj, what) if isinstance(text_or_obj, str) else dict(text_or_obj)
    try:
        return RouterOptions.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(f"{what} {first_error(exc)}") from None


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


def parse_policy(text_or_obj: str | dict[str, Any] | None, base: RouterPolicy | None = None,
                 what: str = "policy") -> RouterPolicy:
    """A policy from JSON holding any subset of the eight fields; the rest from ``base``/defaults.
    Errors start with ``what`` (the CLI passes its option name)."""
    if text_or_obj is None:
        return base or RouterPolicy()
    obj = load_json_object(text_or_obj, what) if isinstance(text_or_obj, str) else dict(text_or_obj)
    for k, v in obj.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{what} {k}: must be finite")
    merged = (base or RouterPolicy()).model_dump() | obj
    try:
        return RouterPolicy.model_validate(merged)
    except ValidationError as exc:
        raise ValueError(f"{what} {first_error(exc)}") from None


def parse_sla(text_or_obj: str | dict[str, Any] | None, what: str = "SLA") -> SLA | None:
    if text_or_obj is None:
        return None
    obj = load_json_object(text_or_obj, what) if isinstance(text_or_obj, str) else dict(text_or_obj)
    try:
        return SLA.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(f"{what} {first_error(exc)}") from None
