"""The sweep grid over the three searched router knobs, and its split into shards.

A grid gives, for each of ``overlap_score_credit``, ``prefill_load_scale`` and
``temperature``, either ``{"choices": [...]}`` or ``{"range": {"min", "max", "step"}}``
(inclusive of both ends). A knob the grid leaves out stays at the current setting. Points
are the Cartesian product in a fixed order (credit outermost, temperature innermost); the
other five policy parameters are copied from the current policy.

The default grid has 6 x 6 x 3 = 108 points:
credit {0, 0.2, 0.4, 0.6, 0.8, 1}, prefill load scale {0.25, 0.5, 1, 2, 4, 8} (around
Dynamo's default 1.0 and up to twice its ``--agentic`` preset of 4), temperature {0, 0.5, 1}.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from powerfleet.sim.policy import SEARCHED_KNOBS, RouterPolicy, error_location, first_error


class KnobRange(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    min: float
    max: float
    step: float = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> KnobRange:
        if self.max < self.min:
            raise ValueError("range max must be >= min")
        if (self.max - self.min) / self.step > 10_000:
            raise ValueError("range has more than 10000 values")
        return self

    def values(self) -> list[float]:
        count = int(math.floor((self.max - self.min) / self.step + 1e-9)) + 1
        return [round(self.min + i * self.step, 12) for i in range(count)]


class KnobSpec(BaseModel):
    """Either explicit choices or an inclusive range."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    choices: list[float] | None = Field(None, min_length=1)
    range: KnobRange | None = None

    @model_validator(mode="after")
    def _one(self) -> KnobSpec:
        if (self.choices is None) == (self.range is None):
            raise ValueError("give exactly one of choices or range")
        return self

    def values(self) -> list[float]:
        vals = list(self.choices) if self.choices is not None else self.range.values()  # type: ignore[union-attr]
        out: list[float] = []
        for v in vals:  # de-duplicate, keep the order given
            if v not in out:
                out.append(float(v))
        return out


class SweepGrid(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overlap_score_credit: KnobSpec | None = None
    prefill_load_scale: KnobSpec | None = None
    temperature: KnobSpec | None = None

    def axes(self, current: RouterPolicy) -> list[tuple[str, list[float]]]:
        out = []
        for knob in SEARCHED_KNOBS:
            spec: KnobSpec | None = getattr(self, knob)
            out.append((knob, spec.values() if spec is not None else [float(getattr(current, knob))]))
        return out

    def points(self, current: RouterPolicy) -> list[RouterPolicy]:
        """Every grid point as a full policy; raises ValueError naming a value out of bounds."""
        axes = self.axes(current)
        base = current.model_dump()
        pts: list[RouterPolicy] = []
        for combo in itertools.product(*(vals for _, vals in axes)):
            d = dict(base)
            d.update({name: v for (name, _), v in zip(axes, combo)})
            try:
                pts.append(RouterPolicy.model_validate(d))
            except ValidationError as exc:
                loc, msg = error_location(exc)
                raise ValueError(f"grid {loc}: {msg} (value {d.get(loc)})") from None
        return pts


DEFAULT_GRID = SweepGrid(
    overlap_score_credit=KnobSpec(choices=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    prefill_load_scale=KnobSpec(choices=[0.25, 0.5, 1.0, 2.0, 4.0, 8.0]),
    temperature=KnobSpec(choices=[0.0, 0.5, 1.0]),
)


def parse_grid(obj: dict[str, Any]) -> SweepGrid:
    try:
        return SweepGrid.model_validate(obj)
    except ValidationError as exc:
        raise ValueError(f"grid {first_error(exc, 'grid')}") from None


def load_grid(source: str | Path | None) -> SweepGrid:
    """``None`` or ``"default"``: the default grid; otherwise a JSON (or YAML) file."""
    if source is None or str(source) == "default":
        return DEFAULT_GRID
    p = Path(source)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read grid {str(p)!r}: {exc.strerror or exc}") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            obj = yaml.safe_load(text)
        else:
            obj = json.loads(text)
    except Exception as exc:  # json or yaml syntax error
        raise ValueError(f"grid {str(p)!r} could not be parsed: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"grid {str(p)!r} must hold an object of knobs")
    return parse_grid(obj)


def split_shards(points: list[Any], max_shards: int) -> list[list[Any]]:
    """Split points, in order, into at most ``max_shards`` contiguous shards whose sizes
    differ by at most one (larger shards first). Every point lands in exactly one shard."""
    if max_shards < 1:
        raise ValueError(f"max_shards must be >= 1, got {max_shards}")
    n = len(points)
    k = min(max_shards, n)
    if k == 0:
        return []
    size, extra = divmod(n, k)
    shards = []
    pos = 0
    for i in range(k):
        m = size + (1 if i < extra else 0)
        shards.append(points[pos : pos + m])
        pos += m
    return shards
