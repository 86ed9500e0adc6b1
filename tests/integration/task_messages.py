"""Hypothesis messages for every fleet task (right and wrong types, internal fields, huge and negative
numbers), and the oracle a test holds the task API's answer to (tests/integration/test_trust_boundary.py)."""

from __future__ import annotations

import types
import typing
from typing import Any

from hypothesis import strategies as st

from powerfleet.tasks.base import args_model_of, manual_fields_of

# A plausible value per field name, so that some messages are accepted.
PLAUSIBLE: dict[str, Any] = {
    "deployment": "ns/llm", "dgd": "llm-agg", "node": "a", "group": "rack-a", "sid": "s1", "payload": {"x": 1},
    "window": 0, "replicas": {"decode": 2}, "load": {"decode": 3.0}, "target_per_replica": {"decode": 1.0},
    "source": "test", "now": 1_000_000.0,
}
HOSTILE = st.one_of(
    st.booleans(), st.none(), st.integers(-10**20, 10**20), st.sampled_from([-1, 0, 10**18, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False), st.integers(-10, 10).map(str), st.text(max_size=8),
    st.dictionaries(st.sampled_from(["decode", "prefill", "worker", "gpu"]),
                    st.one_of(st.booleans(), st.integers(-5, 10**6), st.just("3"), st.floats(-1, 1e6)), max_size=2),
    st.lists(st.integers(), max_size=2))


def fleet_tasks(app: Any) -> list[str]:
    return sorted(n for n, t in app.tasks.items() if n.startswith("powerfleet.") and args_model_of(t) is not None)


def messages(app: Any) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    def for_task(name: str) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
        model = args_model_of(app.tasks[name])
        fields = sorted(model.model_fields)
        required = {f for f, info in model.model_fields.items() if info.is_required()}
        # Mostly the plausible value (so that many sends are accepted), else anything.
        value = {f: st.one_of(st.just(PLAUSIBLE[f]), HOSTILE) if f in PLAUSIBLE else HOSTILE for f in fields}
        optional = st.sets(st.sampled_from([*sorted(set(fields) - required), "bogus"]), max_size=2)
        keys = st.one_of(st.just(frozenset(required)), optional.map(lambda ks: required | ks))
        return keys.flatmap(lambda ks: st.fixed_dictionaries({k: value.get(k, HOSTILE) for k in sorted(ks)})).map(
            lambda kw: (name, kw))

    return st.sampled_from(fleet_tasks(app)).flatmap(for_task)


def must_refuse(app: Any, name: str, kwargs: dict[str, Any]) -> str | None:
    """What a refusal must name when the oracle knows the send is not a person's to make (else None)."""
    manual = manual_fields_of(app.tasks[name])
    if manual is None:
        return f"{name}: an internal task"
    model = args_model_of(app.tasks[name])
    internal = sorted(k for k in kwargs if k in model.model_fields and k not in manual)
    return f"{name}: {internal[0]}: set only by the fleet" if internal else None


def _kinds(annotation: Any) -> set[type]:
    """The plain JSON kinds a field annotated so may take (empty: not a plain field)."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    kinds: set[type] = set()
    for a in args:
        if a is type(None):
            kinds.add(type(None))
        elif a in (int, float, str, bool):
            kinds |= {int, float} if a is float else {a}
        else:
            return set()
    return kinds


def wrongly_typed(app: Any, name: str, kwargs: dict[str, Any]) -> str | None:
    """A top-level value an accepted send must not carry: one of another JSON kind than its field's."""
    model = args_model_of(app.tasks[name])
    for key, value in kwargs.items():
        field = model.model_fields.get(key)
        if field is None:
            return f"unknown key {key!r}"
        kinds = _kinds(field.annotation)
        if kinds and type(value) not in kinds:
            return f"{key}={value!r} for a field of {sorted(k.__name__ for k in kinds)}"
    for role, n in (kwargs.get("replicas") or {}).items() if isinstance(kwargs.get("replicas"), dict) else ():
        if type(n) is not int or not 0 <= n <= 100_000:
            return f"replicas.{role}={n!r}"
    return None
