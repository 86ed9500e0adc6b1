"""The retune state saved in the state Lease: strict JSON in, strict JSON out.

The state survives restarts and leader handovers: the router settings saved before the first
write to each frontend (``initial``), the settings decided for the routers (``desired``), the
last window decided (so none is decided twice or skipped again), the last advisory
recommendation, the rollback phase and a bounded decision history.

Every number rejects booleans, NaN, infinities and strings; any such value, bad JSON or a
wrong type raises ``StateCorrupt``. A corrupt state is reported and replaced on the next
successful claim, never a crash loop (``leadership.StateStore``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from powerfleet.sim.policy import POLICY_FIELDS, first_error

STATE_SCHEMA = "powerfleet.retune.state/v1"
Policy = dict[str, float]


class StateCorrupt(ValueError):
    """The saved state could not be parsed; the message says where."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", frozen=True)


class DecisionRecord(_Strict):
    """One window's outcome as saved in the history (a deep copy, never shared)."""

    window: int
    outcome: Literal["apply", "keep", "no-traffic", "abandoned", "advisory", "dropped", "skipped", "promoted",
                     "rollback"]
    mode: Literal["active", "advisory"]
    params: Policy | None = None
    improvement_pct: float | None = None
    reason: str
    failure_reason: str | None = None
    candidates: int = 0
    candidates_failed: int = 0
    probe_score: float | None = None
    best_score: float | None = None
    replicas: int | None = None
    replicas_verified: bool = False
    requests: int | None = None  # scored requests in the window
    confidence: float | None = None  # the best beats the probe: paired batches, corrected for the search
    runner_up_margin_pct: float | None = None  # best vs the second best, % of |probe score|
    ranking: list[dict[str, Any]] = Field(default_factory=list)  # the best candidates, best first
    term: int
    generation: str
    at: float


class Moved(_Strict):
    """When a router parameter last moved, and from what (the noise guard's dwell)."""

    window: int
    previous: float


class PendingWindow(_Strict):
    """A window launched and not yet ended in an outcome (what the leader must account for)."""

    window: int
    at: float  # when it was launched
    term: int
    generation: str


# How each outcome counts: every window ends in exactly one of these four classes.
OUTCOME_CLASS = {"apply": "decided", "keep": "decided", "advisory": "decided", "no-traffic": "abandoned",
                 "abandoned": "abandoned", "dropped": "dropped", "skipped": "skipped"}
PENDING_MAX = 16  # a leader never has more than a couple in flight; the state stays bounded


class RetuneState(_Strict):
    schema_: str = Field(STATE_SCHEMA, alias="schema")
    term: int = Field(0, ge=0)
    dgd_uid: str = ""  # the DGD this state belongs to (a DGD recreated under the name starts afresh)
    # When this state started for a recreated DGD (this clock): traffic before it is another
    # object's, never cut into this one's windows (None: the first object known here).
    dgd_since: float | None = None
    generation: str = ""
    mode: Literal["active", "advisory"] = "active"
    initial: dict[str, Policy] = Field(default_factory=dict)  # frontend pod -> settings before our first write
    desired: Policy | None = None  # what every router should hold (active mode)
    desired_window: int | None = None
    last_window: int | None = None  # last window decided, kept, or abandoned
    advisory: DecisionRecord | None = None  # last recommendation not applied
    rollback: Literal["none", "intent", "done"] = "none"
    # A rollback (or advisory switch) seen converged is verified again once the PATCH timeout
    # has passed (a late PATCH has landed or failed by then) before it is reported done.
    rollback_verify_at: float | None = None
    history: list[DecisionRecord] = Field(default_factory=list)
    # The window schedule, kept here (fenced) so a Redis restart without persistence neither
    # skips a window nor forgets one in flight: when retune was enabled, the last window
    # launched, and the windows launched that have no outcome yet.
    enabled_at: float | None = None
    last_launched: int | None = None
    pending: list[PendingWindow] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)  # outcome -> windows ended so (cumulative)
    moves: dict[str, Moved] = Field(default_factory=dict)  # parameter -> its last move (dwell)
    updated: float = 0.0

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", frozen=True,
                              populate_by_name=True)

    def with_decision(self, rec: DecisionRecord, keep: int) -> RetuneState:
        """A new state with ``rec`` appended (deep-copied) to the bounded history; a window's
        outcome also ends its pending entry and counts."""
        hist = [*self.history, rec.model_copy(deep=True)][-keep:]
        update: dict[str, Any] = {"history": hist}
        if rec.window >= 0:
            update["pending"] = [p for p in self.pending if p.window != rec.window]
            update["counts"] = {**self.counts, rec.outcome: self.counts.get(rec.outcome, 0) + 1}
        return self.model_copy(update=update)

    def with_skipped(self, rec: DecisionRecord, first: int, keep: int) -> RetuneState:
        """Windows ``first`` .. ``rec.window`` closed and were never launched: one history
        record for the gap, each window counted ``skipped``, and none of them decided later."""
        n = rec.window - first + 1
        last = rec.window if self.last_window is None else max(rec.window, self.last_window)
        return self.model_copy(update={"history": [*self.history, rec.model_copy(deep=True)][-keep:],
                                       "counts": {**self.counts, "skipped": self.counts.get("skipped", 0) + n},
                                       "last_window": last})

    def is_pending(self, k: int) -> bool:
        return any(p.window == k for p in self.pending)

    def decided(self, k: int) -> bool:
        """Window ``k`` has its outcome (or is older than the newest outcome and not in flight)."""
        return self.last_window is not None and k <= self.last_window and not self.is_pending(k)

    def launched(self, k: int, at: float, term: int, generation: str) -> RetuneState:
        keep = [p for p in self.pending if p.window != k]
        pend = [*keep, PendingWindow(window=k, at=at, term=term, generation=generation)][-PENDING_MAX:]
        last = k if self.last_launched is None else max(k, self.last_launched)
        return self.model_copy(update={"pending": pend, "last_launched": last})


def _reject_constant(name: str) -> Any:
    raise StateCorrupt(f"state holds {name}, which is not a number")


def _walk_numbers(obj: Any, path: str) -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        raise StateCorrupt(f"state {path or '(top)'}: number is not finite")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _walk_numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _walk_numbers(v, f"{path}[{i}]")


def _check_policies(state: RetuneState) -> None:
    named = [("desired", state.desired)] + [(f"initial.{k}", v) for k, v in state.initial.items()]
    for where, pol in named:
        if pol is not None and set(pol) != set(POLICY_FIELDS):
            raise StateCorrupt(f"state {where}: must hold exactly the eight router parameters")


def parse_state(text: str | None) -> RetuneState | None:
    """``None`` for no state yet; ``StateCorrupt`` for anything that is not a valid state."""
    if text is None:
        return None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except StateCorrupt:
        raise
    except (json.JSONDecodeError, RecursionError) as exc:
        raise StateCorrupt(f"state is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise StateCorrupt("state must be a JSON object")
    _walk_numbers(obj, "")
    if obj.get("schema") != STATE_SCHEMA:
        raise StateCorrupt(f"state schema must be {STATE_SCHEMA!r}")
    try:
        state = RetuneState.model_validate(obj)
    except ValidationError as exc:
        raise StateCorrupt(f"state {first_error(exc)}") from None
    _check_policies(state)
    return state


def dump_state(state: RetuneState) -> str:
    _check_policies(state)
    return json.dumps(state.model_dump(mode="json", by_alias=True), sort_keys=True, allow_nan=False)

