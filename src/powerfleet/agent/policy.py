"""The cap policy for one GPU: pure, from the pods on it to one decision.

Input per GPU: its distinct pods (by UID), which of them carry the power annotation (raw
value), whether the agent manages the GPU, and the safe default. Caps come only from pod
annotations; nothing here knows about budgets.

=================  =========================================================  ============
decision           when                                                       requested
=================  =========================================================  ============
``idle``           no process on the GPU: keep whatever cap it has            none
``release``        processes, but no pod on it carries the annotation         default (*)
``single``         one pod, valid annotation                                  its watts
``safe_default``   one pod, annotation present but invalid                    safe default
``agree``          several pods, all annotated, all valid, all equal          that value
``conflict``       several pods, one opted in, any missing/invalid/different  safe default
=================  =========================================================  ============

(*) ``release`` restores the GPU's default limit only when this agent manages it (it set a
cap there before); an unmanaged GPU is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from powerfleet.cluster.errors import PowerInputError
from powerfleet.cluster.power import parse_power_annotation


class Kind(StrEnum):
    IDLE = "idle"
    RELEASE = "release"
    SINGLE = "single"
    SAFE_DEFAULT = "safe_default"
    AGREE = "agree"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Decision:
    kind: Kind
    pods: tuple[str, ...]
    watts: int | None  # the requested cap; None for idle and release (release uses the default)
    reason: str = ""

    @property
    def uses_safe_default(self) -> bool:
        return self.kind in (Kind.SAFE_DEFAULT, Kind.CONFLICT)


def _parse(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return parse_power_annotation(raw).watts
    except PowerInputError:
        return None


def decide(pods: Sequence[str], annotations: Mapping[str, str], *, busy: bool, safe_default_watts: int) -> Decision:
    """One GPU's decision. ``pods``: distinct pod UIDs of its processes; ``annotations``: raw values
    of the pods that carry the key (pods absent from it did not opt in, or were not listed)."""
    uids = tuple(sorted(set(pods)))
    if not busy:
        return Decision(Kind.IDLE, uids, None)
    opted = [u for u in uids if u in annotations]
    if not opted:
        return Decision(Kind.RELEASE, uids, None, "no pod on the GPU carries the annotation")
    if len(uids) == 1:
        watts = _parse(annotations[uids[0]])
        if watts is None:
            return Decision(Kind.SAFE_DEFAULT, uids, safe_default_watts,
                            f"invalid annotation {annotations[uids[0]]!r}")
        return Decision(Kind.SINGLE, uids, watts)
    values = {u: _parse(annotations.get(u)) for u in uids}
    missing = [u for u, w in values.items() if u not in annotations]
    invalid = [u for u, w in values.items() if u in annotations and w is None]
    distinct = {w for w in values.values() if w is not None}
    if not missing and not invalid and len(distinct) == 1:
        return Decision(Kind.AGREE, uids, distinct.pop())
    why = []
    if missing:
        why.append(f"{len(missing)} pod(s) without the annotation")
    if invalid:
        why.append(f"{len(invalid)} invalid")
    if len(distinct) > 1:
        why.append(f"values differ: {sorted(distinct)}")
    return Decision(Kind.CONFLICT, uids, safe_default_watts, "; ".join(why))
