"""Where a pod may be scheduled, from its spec: ``nodeSelector`` and the required node affinity
(``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``).

The budget charges a replica that holds no node yet to every group it may land on; a constraint
read here narrows that. Anything not understood (a malformed field, an unknown operator, taints,
which are not read) admits the node: charging a replica to a group it cannot reach only lowers
what others may grow into, while missing one it can reach would let that group go over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


class Requirement(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    operator: str
    values: tuple[str, ...] = ()
    field: bool = False  # a matchFields requirement (the node's metadata.name), not a label

    def admits(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.field:
            if self.key != "metadata.name" or self.operator not in ("In", "NotIn"):
                return True
            return (name in self.values) == (self.operator == "In")
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt"):
            if value is None:
                return False
            try:
                have, bound = int(value), int(self.values[0])
            except (ValueError, IndexError):
                return True  # not comparable: not understood
            return have > bound if op == "Gt" else have < bound
        return True


class Placement(BaseModel):
    """A pod's node constraints. ``terms`` None: no required node affinity; each term is a tuple of
    requirements that must all hold, and any one term suffices."""

    model_config = ConfigDict(frozen=True)

    node_selector: dict[str, str] = {}
    terms: tuple[tuple[Requirement, ...], ...] | None = None

    def admits(self, name: str, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.node_selector.items()):
            return False
        if self.terms is None:
            return True
        return any(all(r.admits(name, labels) for r in term) for term in self.terms)


ANYWHERE = Placement()


def _requirements(raw: Any, field: bool) -> list[Requirement] | None:
    if raw is None:
        return []
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if not isinstance(item, Mapping):
            return None
        key, op, values = item.get("key"), item.get("operator"), item.get("values") or []
        if not isinstance(key, str) or op not in OPERATORS or not isinstance(values, list) or not all(
                isinstance(v, str) for v in values):
            return None
        out.append(Requirement(key=key, operator=op, values=tuple(values), field=field))
    return out


def _field(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``; None where a step is missing or not an object."""
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def placement_of(spec: Mapping[str, Any]) -> Placement:
    """The constraints of a pod spec (JSON); ``ANYWHERE`` for what is absent or not understood."""
    selector = spec.get("nodeSelector")
    if selector is None:
        selector = {}
    if not isinstance(selector, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in selector.items()):
        return ANYWHERE
    raw_terms = _field(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                       "nodeSelectorTerms")
    terms: tuple[tuple[Requirement, ...], ...] | None = None
    if isinstance(raw_terms, list) and raw_terms:
        parsed = []
        for term in raw_terms:
            if not isinstance(term, Mapping):
                return Placement(node_selector=dict(selector))
            exprs, fields = _requirements(term.get("matchExpressions"), False), _requirements(term.get("matchFields"), True)
            if exprs is None or fields is None:
                return Placement(node_selector=dict(selector))
            if exprs or fields:  # an empty term matches no node
                parsed.append(tuple(exprs + fields))
        terms = tuple(parsed)
    return Placement(node_selector=dict(selector), terms=terms)
