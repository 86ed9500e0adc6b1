"""The router actuator: bring every frontend's ``/router_policy`` to its target, safely.

* Each frontend's initial settings are saved (fenced) before this process first PATCHes it,
  including a frontend that appears later.
* Before its first act on a frontend under a term, the leader writes a barrier (an empty
  PATCH that only moves the revision; ``fencing.py``), so a predecessor's PATCH that passed
  its term check and stalled is refused by the revision check.
* PATCH is revision-checked; a conflict re-reads and retries once. Before every PATCH the
  leader term is checked, so a superseded leader writes nothing.
* Targets: during a rollback, each frontend's saved initial settings; in active mode, the
  decided settings (a frontend whose initial ``overlap_score_credit`` is 0 keeps 0); in
  advisory mode nothing is written. A manual change is therefore reverted at the next round.
* Convergence is reported per frontend from what the frontend answered, never assumed: a
  frontend with no saved initial settings that still holds retuned values is not converged
  by a rollback. One frontend failing never stops the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from powerfleet.cluster.router import RevisionConflict, RouterClient, RouterError, RouterPolicyState
from powerfleet.retune.fencing import Barriers
from powerfleet.retune.leadership import Leadership, StateStore, Term
from powerfleet.retune.premises import Frontend
from powerfleet.retune.state import Policy, RetuneState


@dataclass(frozen=True)
class FrontendReport:
    pod: str
    url: str
    converged: bool
    wrote: bool = False
    revision: int | None = None
    error: str | None = None
    policy: Policy | None = None


def same(a: Policy | None, b: Policy | None) -> bool:
    if a is None or b is None:
        return False
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=0, abs_tol=1e-9) for k in a)


def read_all(router: RouterClient, frontends: list[Frontend]) -> tuple[dict[str, RouterPolicyState], dict[str, str]]:
    got: dict[str, RouterPolicyState] = {}
    errors: dict[str, str] = {}
    for fe in frontends:
        try:
            got[fe.pod] = router.get(fe.url)
        except RouterError as exc:
            errors[fe.pod] = str(exc)
    return got, errors


def target_for(state: RetuneState, pod: str, promote: Policy | None = None) -> Policy | None:
    """What ``pod`` should hold now, or None when nothing may be written to it."""
    if state.rollback == "intent":
        return state.initial.get(pod)
    want = promote if promote is not None else (state.desired if state.mode == "active" else None)
    if want is None:
        return None
    init = state.initial.get(pod)
    if init is not None and init.get("overlap_score_credit") == 0:
        want = {**want, "overlap_score_credit": 0.0}
    return dict(want)


class Actuator:
    def __init__(self, router: RouterClient, store: StateStore, leadership: Leadership, term: Term,
                 barriers: Barriers | None = None) -> None:
        self.router, self.store, self.leadership, self.term = router, store, leadership, term
        self.barriers = barriers

    def barrier(self, fe: Frontend, cur: RouterPolicyState) -> RouterPolicyState:
        """Move ``fe``'s revision once per term before acting on it (``RouterError`` if it cannot)."""
        b = self.barriers
        if b is None or b.written(self.term.term, fe.pod):
            return cur
        for attempt in (1, 2):
            self.leadership.check(self.term)
            try:
                cur = self.router.patch(fe.url, {}, cur.revision)
                break
            except RevisionConflict:  # someone wrote in between (perhaps the predecessor): re-read
                if attempt == 2:
                    raise
                cur = self.router.get(fe.url)
        b.mark(self.term.term, fe.pod)
        return cur

    def save_initials(self, state: RetuneState, current: dict[str, RouterPolicyState],
                      present: set[str] | None = None) -> RetuneState:
        """Save unseen frontends' settings as their initial ones, before anything is written.

        Not during a rollback, and not for a frontend already on the decided values: those
        values are ours (a PATCH whose save was lost), and learning them as "initial" would
        let a rollback call a retuned router converged.
        """
        if state.rollback == "intent":
            return state
        new = {pod: st.policy for pod, st in current.items()
               if pod not in state.initial and not same(st.policy, state.desired)}
        # Pods that no longer exist leave the state (it must stay far below the 256 KiB
        # annotation limit through any number of rollouts); not during a rollback, which needs them.
        gone = set(state.initial) - present if present else set()  # never on an empty pod list
        if not new and not gone:
            return state
        return self.store.update(self.term, lambda s: s.model_copy(update={
            "initial": {p: v for p, v in {**new, **s.initial}.items() if p not in gone}}))

    def reconcile(self, frontends: list[Frontend], state: RetuneState, promote: Policy | None = None,
                  present: set[str] | None = None) -> tuple[RetuneState, list[FrontendReport]]:
        """One round over ``frontends``; ``present``: every frontend pod that exists (with or
        without a router URL), whose initial settings are kept."""
        current, errors = read_all(self.router, frontends)
        for fe in frontends:  # the barrier comes first: what is read after it is final
            if fe.pod in current:
                try:
                    current[fe.pod] = self.barrier(fe, current.pop(fe.pod))
                except RouterError as exc:
                    errors[fe.pod] = f"barrier not written: {exc}"
        state = self.save_initials(state, current, present)  # before any PATCH (fenced)
        reports = []
        for fe in frontends:
            if fe.pod in errors:
                reports.append(FrontendReport(fe.pod, fe.url, False, error=errors[fe.pod]))
                continue
            reports.append(self._one(fe, state, current[fe.pod], promote))
        return state, reports

    def _one(self, fe: Frontend, state: RetuneState, cur: RouterPolicyState,
             promote: Policy | None) -> FrontendReport:
        target = target_for(state, fe.pod, promote)
        if target is None:
            if state.rollback == "intent":
                retuned = state.desired is not None and same(cur.policy, state.desired)
                why = "no saved initial settings" + ("; still on retuned values" if retuned else "")
                return FrontendReport(fe.pod, fe.url, not retuned, revision=cur.revision, error=why, policy=cur.policy)
            conv = state.desired is None or same(cur.policy, state.desired)
            return FrontendReport(fe.pod, fe.url, conv, revision=cur.revision, policy=cur.policy)
        wrote = False
        for attempt in (1, 2):
            if same(cur.policy, target):
                return FrontendReport(fe.pod, fe.url, True, wrote, cur.revision, policy=cur.policy)
            self.leadership.check(self.term)  # a superseded leader PATCHes nothing
            try:
                cur = self.router.patch(fe.url, target, cur.revision)
                wrote = True
            except RevisionConflict as exc:
                if attempt == 2:
                    return FrontendReport(fe.pod, fe.url, False, wrote, cur.revision, error=str(exc))
                try:
                    cur = self.router.get(fe.url)
                except RouterError as exc2:
                    return FrontendReport(fe.pod, fe.url, False, wrote, error=str(exc2))
            except RouterError as exc:
                return FrontendReport(fe.pod, fe.url, False, wrote, cur.revision, error=str(exc))
        ok = same(cur.policy, target)
        return FrontendReport(fe.pod, fe.url, ok, wrote, cur.revision, policy=cur.policy)
