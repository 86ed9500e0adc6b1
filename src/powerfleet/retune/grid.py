"""The sweep grid over the three searched router knobs, and its split into shards.

A grid gives, for each of ``overlap_score_credit``, ``prefill_load_scale`` and
``temperature``, either ``{"choices": [...]}`` or ``{"range": {"min", "max", "step"}}``
(inclusive of both ends). A knob the grid leaves out stays at the current setting, and so does a knob that cannot
change the deployment's replay (``SweepGrid.for_deployment``, ``retune.effect``). Points
are the Cartesian product in a fixed order (credit outermost, temperature innermost); the
other five policy parameters are copied from the current policy.

The default grid has 6 x 6 x 3 = 108 points:
credit {0, 0.2, 0.4, 0.6, 0.8, 1}, prefill load scale {0.25, 0.5, 1, 2, 4, 8} (around
Dynamo's default 1.0 and up to twice its ``--agentic`` preset of 4), temperature {0, 0.5, 1}.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from powerfleet.retune.decision import Candidate, rank
from powerfleet.retune.effect import pure_scales
from powerfleet.textinput import InputError, read_text
from powerfleet.retune.objectives import Objective
from powerfleet.sim.policy import SEARCHED_KNOBS, RouterOptions, RouterPolicy, error_location, first_error


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

    def held_knobs(self, current: RouterPolicy, *, disaggregated: bool,
                   options: RouterOptions | None = None) -> list[str]:
        """The searched knobs that cannot change this deployment's replay from ``current``
        (``retune.effect.pure_scales``: for a disaggregated one, the prefill load scale while
        the active-request weight is 0); none for an aggregated deployment."""
        return pure_scales(current, self.axes(current), disaggregated=disaggregated, options=options)

    def for_deployment(self, current: RouterPolicy, *, disaggregated: bool,
                       options: RouterOptions | None = None) -> SweepGrid:
        """This grid with ``held_knobs`` left out (held at the current setting), so a sweep
        replays only candidates that can differ. Every sweep (``run_sweep``, the live window
        and its edge search) takes its points and axes from here."""
        held = self.held_knobs(current, disaggregated=disaggregated, options=options)
        return self.model_copy(update={k: None for k in held}) if held else self

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
    """``None`` or ``"default"``: the default grid; otherwise a JSON (or YAML) file.
    Every failure (unreadable, not UTF-8, bad syntax, bad knobs) is one ValueError line."""
    if source is None or str(source) == "default":
        return DEFAULT_GRID
    p = Path(source)
    try:
        text = read_text(p)  # bounded: a grid of /dev/zero fails in one line
    except InputError as exc:
        raise ValueError(f"grid: {exc}") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            try:
                obj = yaml.safe_load(text)
            except yaml.MarkedYAMLError as exc:
                mark = exc.problem_mark
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                raise ValueError(f"{exc.problem or exc.context or 'invalid YAML'}{where}") from None
        else:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except Exception as exc:  # any other YAML error (tags, recursion): still one line
        msg = " ".join(str(exc).split())
        raise ValueError(f"grid {str(p)!r} could not be parsed: {msg}") from None
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


class EdgeSearch(BaseModel):
    """Searching beyond the grid's edge (``beyond_edge``), as the sweep runs it.

    When the best candidate sits on a searched knob's largest (smallest non-zero) value,
    that knob is extended in that direction by ``factor`` (geometric steps), one new point
    per knob per round, other knobs held at the best's values; a round runs only while the
    previous one moved the best, for at most ``max_rounds`` rounds and while the sweep's
    wall-clock budget lasts. ``refine`` then adds the geometric midpoints between the best
    value and its neighbours, one round.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    enabled: bool = True
    factor: float = Field(2.0, gt=1.0)
    max_rounds: int = Field(6, ge=0, le=50)
    refine: bool = False


def _key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(params.items()))


def _mid(a: float, b: float) -> float:
    return round(math.sqrt(a * b) if a > 0 and b > 0 else (a + b) / 2, 12)


def beyond_edge(
    axes: list[tuple[str, list[float]]],
    scored: list[Any],
    best: dict[str, Any] | None,
    factor: float = 2.0,
    refine: bool = False,
) -> list[RouterPolicy]:
    """New points to score around ``best`` (a candidate's params), given the grid's ``axes``
    and every candidate ``scored`` so far (objects with ``params``): the next geometric step
    beyond each searched knob's edge where the best sits on it, or with ``refine`` (and no
    edge left) the midpoints around the best. Points already scored or out of bounds are
    left out; an empty list means the search is over."""
    if best is None:
        return []
    seen = {_key(c.params) for c in scored}
    out: list[RouterPolicy] = []

    def add(knob: str, value: float) -> None:
        d = dict(best)
        d[knob] = round(value, 12)
        try:
            p = RouterPolicy.model_validate(d)
        except ValidationError:
            return  # beyond the knob's bounds: that edge is final
        if _key(p.model_dump()) not in seen and all(_key(q.model_dump()) != _key(p.model_dump()) for q in out):
            out.append(p)

    searched = [(k, vals) for k, vals in axes if len(vals) > 1]
    for knob, vals in searched:
        values = sorted(set(vals) | {float(c.params[knob]) for c in scored if knob in c.params})
        v = float(best[knob])
        if v >= values[-1] and v > 0:
            add(knob, v * factor)
        elif v <= values[0] and v > 0:
            add(knob, v / factor)
    if out or not refine:
        return out
    for knob, vals in searched:
        values = sorted(set(vals) | {float(c.params[knob]) for c in scored if knob in c.params})
        v = float(best[knob])
        i = values.index(v) if v in values else None
        if i is None:
            continue
        if i > 0:
            add(knob, _mid(values[i - 1], v))
        if i + 1 < len(values):
            add(knob, _mid(v, values[i + 1]))
    return out


def search_round(
    axes: list[tuple[str, list[float]]],
    scored: list[Candidate],
    objective: Objective | str,
    search: EdgeSearch,
    rounds_done: int,
) -> list[RouterPolicy]:
    """The points of the next round of the search beyond the grid's edge, given every
    candidate scored so far (grid and earlier rounds); empty when the search is over. One
    step, so the local sweep (``search_beyond``) and the live harvest (one fan-out per
    round) run the same search."""
    if not search.enabled or rounds_done >= search.max_rounds:
        return []
    ranked = rank(scored, objective)
    return beyond_edge(axes, scored, ranked[0].params if ranked else None, search.factor, search.refine)


def search_beyond(
    axes: list[tuple[str, list[float]]],
    scored: list[Candidate],
    objective: Objective | str,
    score_points: Callable[[list[RouterPolicy]], list[Candidate]],
    search: EdgeSearch,
    keep_going: Callable[[], bool] = lambda: True,
) -> list[Candidate]:
    """Rounds of ``search_round`` around the best so far; returns the new candidates, each
    marked ``origin="search"``. Stops when no point is left, after ``max_rounds``, or when
    ``keep_going()`` (the time budget) says so."""
    found: list[Candidate] = []
    rounds = 0
    while keep_going():
        new = search_round(axes, scored + found, objective, search, rounds)
        if not new:
            break
        rounds += 1
        found.extend(c.model_copy(update={"origin": "search"}) for c in score_points(new))
    return found
