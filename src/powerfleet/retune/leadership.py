"""Leadership per deployment through a Kubernetes Lease, and the fenced retune state.

* Leadership Lease ``<dgd>-powerfleet-retune``: get, check the holder, update with the
  resourceVersion read (never a blind write). The leader term is the Lease's
  ``leaseTransitions``; it grows by one on every change of holder.
* Expiry is measured on this process's monotonic clock: another holder's Lease counts as
  expired only after this process has seen the same resourceVersion for a whole
  ``lease_duration_s`` (remote timestamps are never compared with the local clock).
* State Lease ``<dgd>-powerfleet-retune-state`` holds ``RetuneState`` in an annotation. Every
  write is fenced: the leadership Lease must still name this holder at this term, the saved
  state must not carry a later term, and the update carries the state Lease's
  resourceVersion, so a superseded leader that resumes cannot write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from powerfleet.clock import Clock
from powerfleet.cluster.leases import Lease, LeaseConflict, LeasePort, NotFound
from powerfleet.retune.state import STATE_SCHEMA, RetuneState, StateCorrupt, dump_state, parse_state

STATE_ANNOTATION = "powerfleet.nvidia.com/retune-state"
# Each frontend's initial settings, also kept on their own: a corrupt state loses everything
# else, but its replacement starts from these, so a rollback still restores every router.
INITIAL_ANNOTATION = "powerfleet.nvidia.com/retune-initial"
LABELS = {"app.kubernetes.io/managed-by": "powerfleet", "powerfleet.nvidia.com/part": "retune"}


class Fenced(Exception):
    """This process no longer holds the term it acts for; the write was not made."""


def leader_lease_name(dgd: str) -> str:
    return f"{dgd}-powerfleet-retune"


def state_lease_name(dgd: str) -> str:
    return f"{dgd}-powerfleet-retune-state"


@dataclass(frozen=True)
class Term:
    """What a leader acts under: passed to every fenced write and carried by sweep tasks."""

    dgd: str
    identity: str
    term: int


@dataclass
class _Seen:
    resource_version: str
    since_mono: float


# Per-process observations of other holders' Leases (expiry is local and monotonic), keyed
# by the observer's identity too so two electors in one process never share a timer.
_SEEN: dict[tuple[str, str, str], _Seen] = {}
# When this process last renewed a Lease it holds (monotonic), to renew once per period.
_RENEWED: dict[tuple[str, str, str], float] = {}


class Leadership:
    def __init__(self, leases: LeasePort, namespace: str, dgd: str, identity: str, *,
                 duration_s: int, clock: Clock, renew_s: float = 0.0,
                 stopping: Callable[[], bool] | None = None) -> None:
        self.leases, self.namespace, self.dgd, self.identity = leases, namespace, dgd, identity
        self.duration_s, self.clock, self.renew_s = duration_s, clock, renew_s
        self.stopping = stopping or (lambda: False)  # this holder's stop has begun (retune.shutdown)
        self.name = leader_lease_name(dgd)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    def _expired(self, lease: Lease) -> bool:
        key = (self.namespace, self.name, self.identity)
        seen = _SEEN.get(key)
        mono = self.clock.monotonic()
        version = f"{lease.uid}/{lease.resource_version}"  # another Lease object is another timer
        if seen is None or seen.resource_version != version:
            _SEEN[key] = _Seen(version, mono)
            return False
        return mono - seen.since_mono >= self.duration_s

    def current(self) -> Lease | None:
        try:
            return self.leases.get_lease(self.namespace, self.name)
        except NotFound:
            return None

    def claim(self) -> tuple[Term | None, str | None, bool]:
        """(term, holder, acquired): take or renew the Lease; term None when another holds it,
        or when this holder has begun to stop (then it holds nothing: a claim that landed just
        before the stop's mark is given back, as the stop's release may have read before it)."""
        if self.stopping():
            return None, f"{self.identity} (stopping)", False
        t, holder, acquired = self._claim()
        if t is not None and self.stopping():
            self.release()
            return None, f"{self.identity} (stopping)", False
        return t, holder, acquired

    def _claim(self) -> tuple[Term | None, str | None, bool]:
        lease = self.current()
        now = self._now()
        if lease is None:
            body = Lease(name=self.name, namespace=self.namespace, holder_identity=self.identity,
                         lease_duration_seconds=self.duration_s, acquire_time=now, renew_time=now,
                         lease_transitions=1, labels=dict(LABELS))
            try:
                made = self.leases.create_lease(body)
            except LeaseConflict:
                return None, None, False
            _RENEWED[(self.namespace, self.name, self.identity)] = self.clock.monotonic()
            return Term(self.dgd, self.identity, made.lease_transitions or 1), self.identity, True
        transitions = lease.lease_transitions or 0
        key = (self.namespace, self.name, self.identity)
        if lease.holder_identity == self.identity:
            last = _RENEWED.get(key)
            if last is not None and self.clock.monotonic() - last < self.renew_s:
                return Term(self.dgd, self.identity, transitions), self.identity, False  # renewed recently
            body = lease.model_copy(update={"renew_time": now, "lease_duration_seconds": self.duration_s})
            acquired = False
        elif not lease.holder_identity or self._expired(lease):
            transitions += 1
            body = lease.model_copy(update={"holder_identity": self.identity, "acquire_time": now, "renew_time": now,
                                            "lease_transitions": transitions,
                                            "lease_duration_seconds": self.duration_s})
            acquired = True
        else:
            return None, lease.holder_identity, False
        try:
            self.leases.update_lease(body)
        except (LeaseConflict, NotFound):
            return None, lease.holder_identity, False
        _RENEWED[key] = self.clock.monotonic()
        return Term(self.dgd, self.identity, transitions), self.identity, acquired

    def raise_term(self, term: Term, to: int) -> Term:
        """Move a held Lease's term up to ``to`` (a Lease recreated below a saved state's term)."""
        self.check(term)
        lease = self.current()
        assert lease is not None  # check() just read it
        try:
            self.leases.update_lease(lease.model_copy(update={"lease_transitions": to}))
        except (LeaseConflict, NotFound):
            raise Fenced(f"{self.dgd}: the Lease changed while raising term {term.term} to {to}") from None
        return Term(self.dgd, self.identity, to)

    def check(self, term: Term) -> None:
        """Raise ``Fenced`` unless the Lease still names this holder at this term."""
        lease = self.current()
        if lease is None or lease.holder_identity != term.identity or (lease.lease_transitions or 0) != term.term:
            holder = lease.holder_identity if lease else None
            now_term = lease.lease_transitions if lease else None
            raise Fenced(f"{self.dgd}: term {term.term} of {term.identity} is superseded "
                         f"(holder {holder!r}, term {now_term})")

    def release(self) -> bool:
        """Give the Lease up if this process holds it (a stop); True if released. A conflict
        (a renewal by this holder's own running task, between the read and the write) re-reads
        and tries again, up to ``STATE_ATTEMPTS`` times."""
        for _ in range(STATE_ATTEMPTS):
            lease = self.current()
            if lease is None or lease.holder_identity != self.identity:
                return False
            try:
                self.leases.update_lease(lease.model_copy(update={"holder_identity": None, "renew_time": None}))
            except LeaseConflict:
                continue
            except NotFound:
                return False
            return True
        return False


# Tries of one fenced state update against resourceVersion conflicts (each re-reads).
STATE_ATTEMPTS = 4


class StateStore:
    """The state Lease: read (reporting corruption), claim-write and fenced updates."""

    def __init__(self, leases: LeasePort, leadership: Leadership) -> None:
        self.leases, self.leadership = leases, leadership
        self.namespace, self.name = leadership.namespace, state_lease_name(leadership.dgd)

    def _lease(self) -> Lease | None:
        try:
            return self.leases.get_lease(self.namespace, self.name)
        except NotFound:
            return None

    def read(self) -> tuple[RetuneState | None, str | None]:
        """(state, corrupt reason): a corrupt state reads as (None, why), never raises."""
        lease = self._lease()
        if lease is None:
            return None, None
        try:
            return parse_state(lease.annotations.get(STATE_ANNOTATION)), None
        except StateCorrupt as exc:
            return None, str(exc)

    def _write(self, lease: Lease | None, state: RetuneState) -> RetuneState:
        text = dump_state(state)
        initial = json.dumps(state.initial, sort_keys=True, allow_nan=False)
        if lease is None:
            self.leases.create_lease(Lease(name=self.name, namespace=self.namespace, labels=dict(LABELS),
                                           annotations={STATE_ANNOTATION: text, INITIAL_ANNOTATION: initial}))
        else:
            ann = dict(lease.annotations)
            ann[STATE_ANNOTATION] = text
            ann[INITIAL_ANNOTATION] = initial
            self.leases.update_lease(lease.model_copy(update={"annotations": ann}))
        return state

    @staticmethod
    def _saved_initial(lease: Lease | None) -> dict[str, dict[str, float]]:
        """The initial settings kept beside the state ({} when missing or unreadable)."""
        raw = lease.annotations.get(INITIAL_ANNOTATION) if lease is not None else None
        if raw is None:
            return {}
        try:
            state = parse_state(json.dumps({"schema": STATE_SCHEMA, "initial": json.loads(raw)}))
        except (StateCorrupt, ValueError, RecursionError):
            return {}
        return dict(state.initial) if state is not None else {}

    def update(self, term: Term, change: Callable[[RetuneState], RetuneState], *,
               replace_corrupt: bool = False) -> RetuneState:
        """Apply ``change`` to the saved state under ``term``; ``Fenced`` if the term is gone.

        A stale resourceVersion (someone wrote in between) re-reads and retries, the term
        checked again before each try, up to ``STATE_ATTEMPTS`` tries: a conflict is a write
        that came first, not a lost term. With ``replace_corrupt`` (the claim), a missing or
        corrupt state starts from empty.
        """
        for attempt in range(1, STATE_ATTEMPTS + 1):
            self.leadership.check(term)
            lease = self._lease()
            try:
                current = parse_state(lease.annotations.get(STATE_ANNOTATION)) if lease else None
            except StateCorrupt:
                if not replace_corrupt:
                    raise
                current = None
            base = current or RetuneState(term=term.term, initial=self._saved_initial(lease))
            if base.term > term.term:
                raise Fenced(f"{term.dgd}: saved state carries term {base.term}, later than {term.term}")
            new = change(replace_term(base, term.term))
            new = new.model_copy(update={"term": term.term, "updated": self.leadership.clock.now()})
            try:
                return self._write(lease, new)
            except LeaseConflict:
                if attempt == STATE_ATTEMPTS:
                    raise Fenced(f"{term.dgd}: the state Lease changed under term {term.term} "
                                 f"on {STATE_ATTEMPTS} tries in a row") from None
        raise AssertionError("unreachable")

    def delete(self, term: Term) -> None:
        """Remove the state and the leadership Lease (retune disabled/removed), fenced by term."""
        self.leadership.check(term)
        lease = self._lease()
        if lease is not None:
            self.leases.delete_lease(self.namespace, self.name, resource_version=lease.resource_version)
        leader = self.leadership.current()
        if leader is not None and leader.holder_identity == term.identity:
            self.leases.delete_lease(self.namespace, self.leadership.name, resource_version=leader.resource_version)


def replace_term(state: RetuneState, term: int) -> RetuneState:
    return state if state.term == term else state.model_copy(update={"term": term})


__all__ = ["Leadership", "StateStore", "Term", "Fenced", "leader_lease_name", "state_lease_name"]
