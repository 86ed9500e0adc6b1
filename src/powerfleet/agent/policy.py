"""The cap policy for one GPU: pure, from what is known about its processes to one decision.

Input per GPU: the distinct pods (by UID) its processes map to, how many processes map to
no pod (unreadable, vanished, host processes), which pods the pod view holds and which of
them carry the power annotation (raw value), whether that view covers every namespace, the
card's range and the safe default. Caps come only from pod annotations; nothing here knows
about budgets.

=================  ===========================================================  =====================
decision           when                                                         requested
=================  ===========================================================  =====================
``idle``           no process on the GPU: keep whatever cap it has              none
``hold``           a blind proc root (no process can be attributed) and no      none: the cap stays
                   opted-in pod
``safe_default``   processes of an unknown owner (a host process, an            safe default (**)
                   unreadable entry, a pod outside the namespaces it sees)
                   and no opted-in pod
``release``        every process belongs to a known pod and none opted in       default (*)
                   (a pod gone from a complete view counts as gone)
``single``         one pod, valid annotation, nothing unattributed              its watts
``safe_default``   one pod, annotation present but invalid                      safe default
``agree``          several pods, all annotated, all valid, all equal            that value
``conflict``       an opted-in pod shares the GPU with a different, missing or  the lowest valid cap,
                   invalid value, or with unattributed processes                and the safe default
                                                                                when a value is missing
                                                                                or invalid; with
                                                                                unattributed processes
                                                                                (and ``current_mw``
                                                                                known) at most the
                                                                                GPU's current cap
=================  ===========================================================  =====================

Unattributed processes beside an opted-in pod (a PID that just exited, a blind proc root
beside an allocation) keep the GPU's current cap, lowered only by a valid annotation: they are
uncertainty, not a pod without a value, so they never bring the safe default in.

(**) Safe by default: a GPU nobody opted in but somebody unknown uses may draw anything, so it
takes the safe default (``unknown_owner``); the caller leaves a GPU it does not manage alone when
its limit is already at or below it. What is positively known to be nobody's (an exited PID, a
pod known gone, an MPS server whose clients are known: agent/attribution.py) is not unknown.

(*) ``release`` restores the GPU's default limit only when this agent manages it (it set a
cap there before); an unmanaged GPU is left alone. Requested values are milliwatts and are
clamped into the card's range by the caller.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from powerfleet.cluster.errors import PowerInputError
from powerfleet.cluster.power import parse_power_annotation


class Kind(StrEnum):
    IDLE = "idle"
    HOLD = "hold"
    RELEASE = "release"
    SINGLE = "single"
    SAFE_DEFAULT = "safe_default"
    AGREE = "agree"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Decision:
    kind: Kind
    pods: tuple[str, ...]
    requested_mw: int | None  # None for idle, hold and release (release uses the default)
    reason: str = ""
    unattributed: int = 0  # processes on the GPU mapped to no pod the agent can see
    safe_default: bool = False  # the requested value is the safe default
    unknown_owner: bool = False  # safe default because processes of an unknown owner and no opted-in pod

    @property
    def uses_safe_default(self) -> bool:
        return self.safe_default


def _parse_mw(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return parse_power_annotation(raw).watts * 1000
    except PowerInputError:
        return None


def decide(pods: Sequence[str], annotations: Mapping[str, str], *, busy: bool, safe_default_mw: int,
           unmapped: int = 0, listed: Collection[str] | None = None, complete: bool = True,
           current_mw: int | None = None, blind: bool = False) -> Decision:
    """One GPU's decision.

    ``pods``: distinct pod UIDs of its mapped processes; ``unmapped``: how many of its processes
    map to no pod; ``annotations``: raw values of the listed pods that carry the key; ``listed``:
    UIDs of every listed pod (None: take ``annotations`` as the whole view, for callers that
    only know annotated pods); ``complete``: the view covers every namespace, so a pod absent
    from it is gone rather than unseen; ``current_mw``: the GPU's limit now (what unattributed
    processes keep; None: they bring the safe default in, as a pod without a value does);
    ``blind``: the proc root cannot attribute any process, so unattributed ones hold the cap
    rather than bring the safe default.
    """
    uids = tuple(sorted(set(pods)))
    if not busy:
        return Decision(Kind.IDLE, uids, None)
    seen = set(annotations) if listed is None else set(listed) | set(annotations)
    unseen = [u for u in uids if u not in seen]
    present = [u for u in uids if u in seen]
    unknown = unmapped + (0 if complete else len(unseen))  # gone pods (complete view) count for nothing
    opted = [u for u in present if u in annotations]
    if not opted:
        if unknown and blind:
            return Decision(Kind.HOLD, uids, None, f"{unknown} process(es) or pod(s) the agent cannot attribute; "
                                                   "the cap stays", unattributed=unknown)
        if unknown:
            return Decision(Kind.SAFE_DEFAULT, uids, safe_default_mw,
                            f"{unknown} process(es) or pod(s) of an unknown owner and no opted-in pod",
                            unattributed=unknown, safe_default=True, unknown_owner=True)
        why = "no pod on the GPU carries the annotation" if present else "its pods are gone from a complete list"
        return Decision(Kind.RELEASE, uids, None, why)
    values = {u: _parse_mw(annotations.get(u)) for u in present}
    if len(present) == 1 and not unknown:
        mw = values[present[0]]
        if mw is None:
            return Decision(Kind.SAFE_DEFAULT, uids, safe_default_mw, f"invalid annotation {annotations[present[0]]!r}",
                            safe_default=True)
        return Decision(Kind.SINGLE, uids, mw)
    missing = [u for u in present if u not in annotations]
    invalid = [u for u in opted if values[u] is None]
    distinct = sorted({w for w in values.values() if w is not None})
    if not missing and not invalid and not unknown and len(distinct) == 1:
        return Decision(Kind.AGREE, uids, distinct[0])
    why = []
    if missing:
        why.append(f"{len(missing)} pod(s) without the annotation")
    if invalid:
        why.append(f"{len(invalid)} invalid")
    if unknown:
        why.append(f"{unknown} unattributed")
    if len(distinct) > 1:
        why.append(f"values differ: {[w / 1000 for w in distinct]} W")
    # The lowest valid cap involved; a pod without a valid value brings the safe default in.
    candidates = list(distinct)
    unsure = bool(missing or invalid or (unknown and current_mw is None))
    if unsure:
        candidates.append(safe_default_mw)
    if unknown and current_mw is not None:
        candidates.append(current_mw)  # uncertainty keeps the cap in force; only a valid value lowers it
        why.append("current cap kept")
    chosen = min(candidates)
    return Decision(Kind.CONFLICT, uids, chosen, "; ".join(why), unattributed=unknown,
                    safe_default=chosen == safe_default_mw and unsure)
