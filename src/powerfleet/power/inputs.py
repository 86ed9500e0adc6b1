"""Parsers for the what-if's text options; each raises ``ValueError`` in one line naming the option."""

from __future__ import annotations

import math

from powerfleet.sim.policy import SLA, parse_sla


def parse_sla_pairs(text: str | None, what: str = "--sla") -> SLA | None:
    """``ttft_ms=2000,itl_ms=50`` or ``e2e_ms=30000`` (or the JSON object ``sim replay`` takes)."""
    if text is None:
        return None
    if text.lstrip().startswith("{"):
        return parse_sla(text, what=what)
    obj: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{what} must be KEY=VALUE pairs separated by commas, e.g. ttft_ms=2000,itl_ms=50; "
                             f"got {text!r}")
        if key in obj:
            raise ValueError(f"{what}: {key} given twice")
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"{what}: {key} must be a number of ms, got {value.strip()!r}") from None
        obj[key] = number
    return parse_sla(obj, what=what)


def parse_span(text: str | None, what: str) -> tuple[float, float] | None:
    """``A:B`` seconds, 0 <= A < B, both finite."""
    if text is None:
        return None
    a, sep, b = text.partition(":")
    if not sep:
        raise ValueError(f"{what} must be A:B in seconds, got {text!r}")
    try:
        lo, hi = float(a.strip()), float(b.strip())
    except ValueError:
        raise ValueError(f"{what} must be A:B in seconds, got {text!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise ValueError(f"{what} must satisfy 0 <= A < B (finite seconds), got {text!r}")
    return lo, hi
