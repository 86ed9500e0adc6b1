"""The /router_policy contract: loopback frontend, httpx client, and the actuator's revision checks."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.cluster.router import RevisionConflict, RouterClient, RouterError, parse_answer
from powerfleet.retune.actuator import Actuator, target_for
from powerfleet.retune.leadership import Fenced, Term
from powerfleet.retune.premises import Frontend
from powerfleet.retune.state import RetuneState
from powerfleet.sim.policy import RouterPolicy
from powerfleet.twin.serving.frontend import LoopbackFrontend

DESIRED = {**RouterPolicy().model_dump(), "temperature": 0.0, "prefill_load_scale": 4.0}


def test_get_patch_and_a_stale_revision() -> None:
    with LoopbackFrontend({"temperature": 1.0}) as fe, RouterClient(leader="me/1") as c:
        got = c.get(fe.url)
        assert (got.revision, got.policy["temperature"]) == (0, 1.0) and len(got.policy) == 8
        assert c.patch(fe.url, {"temperature": 0.5}, 0).revision == 1
        with pytest.raises(RevisionConflict):
            c.patch(fe.url, {"temperature": 0.1}, 0)
        assert fe.policy.temperature == 0.5 and [w.status for w in fe.writes] == [200, 409]
        assert fe.writes[0].leader == "me/1"


def test_unreachable_or_malformed_frontends_are_one_line_errors() -> None:
    with RouterClient(timeout_s=0.5) as c:
        with pytest.raises(RouterError, match="router_policy"):
            c.get("http://127.0.0.1:9")


@settings(max_examples=150, deadline=None)
@given(body=st.one_of(st.binary(max_size=80), st.builds(json.dumps, st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["revision", "policy", "temperature", "x"]), c,
                                                        max_size=3), max_leaves=8)).map(str.encode)))
def test_the_frontend_refuses_bad_bodies_and_keeps_its_policy(body: bytes) -> None:
    fe = LoopbackFrontend()
    before = fe.policy
    status, reply = fe.patch(body)
    assert status in (200, 400, 409)
    if status != 200:
        assert fe.policy == before and "error" in reply
    else:
        assert RouterPolicy.model_validate(reply["policy"]) == fe.policy


class _RacingFrontend(LoopbackFrontend):
    """Another writer changes the policy just before our PATCH lands, ``races`` times."""

    def __init__(self, races: int) -> None:
        super().__init__({"temperature": 1.0})
        self.races = races

    def patch(self, raw: bytes, leader: str | None = None):  # type: ignore[override]
        if self.races > 0 and leader == "me":
            self.races -= 1
            super().patch(json.dumps({"revision": self.revision, "policy": {"temperature": 0.9}}).encode(), "other")
        return super().patch(raw, leader)


class _Lead:
    def __init__(self, ok: bool = True) -> None:
        self.ok = ok

    def check(self, term: Term) -> None:
        if not self.ok:
            raise Fenced("superseded")


class _Store:
    def update(self, term, change):  # type: ignore[no-untyped-def]
        return change(self.state)

    state = RetuneState(term=1, desired=DESIRED)


@pytest.mark.parametrize("races,converged", [(1, True), (2, False)])
def test_a_revision_conflict_rereads_and_retries_once(races: int, converged: bool) -> None:
    with _RacingFrontend(races) as fe, RouterClient(leader="me") as c:
        act = Actuator(c, _Store(), _Lead(), Term("d", "me", 1))  # type: ignore[arg-type]
        _, reports = act.reconcile([Frontend("fe-0", fe.url)], _Store.state)
        assert reports[0].converged is converged
        assert (fe.policy.temperature == 0.0) is converged


def test_initials_are_saved_before_the_first_patch_and_a_fenced_leader_writes_nothing() -> None:
    with LoopbackFrontend({"temperature": 1.0}) as fe, RouterClient(leader="me") as c:
        store = _Store()
        with pytest.raises(Fenced):
            Actuator(c, store, _Lead(ok=False), Term("d", "me", 1)).reconcile(  # type: ignore[arg-type]
                [Frontend("fe-0", fe.url)], _Store.state)
        assert fe.writes == []
        state, reports = Actuator(c, store, _Lead(), Term("d", "me", 1)).reconcile(  # type: ignore[arg-type]
            [Frontend("fe-0", fe.url)], _Store.state)
        assert state.initial["fe-0"]["temperature"] == 1.0 and reports[0].converged


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=120) | st.builds(lambda rev, pol: json.dumps({"revision": rev, "policy": pol}).encode(),
                                                  st.one_of(st.integers(), st.booleans(), st.none(), st.text(max_size=3)),
                                                  st.dictionaries(st.sampled_from(list(RouterPolicy.model_fields)),
                                                                  st.one_of(st.floats(), st.booleans(), st.text(max_size=2)))))
def test_a_frontend_answer_is_a_full_finite_policy_or_a_router_error(body: bytes) -> None:
    try:
        got = parse_answer("http://fe", httpx.Response(200, content=body))
    except RouterError:
        return
    assert set(got.policy) == set(RouterPolicy.model_fields) and isinstance(got.revision, int)


def test_a_frontend_that_started_with_credit_zero_keeps_it_at_zero() -> None:
    zero = {**RouterPolicy().model_dump(), "overlap_score_credit": 0.0}
    state = RetuneState(term=1, desired=DESIRED, initial={"fe-0": zero, "fe-1": RouterPolicy().model_dump()})
    assert target_for(state, "fe-0")["overlap_score_credit"] == 0.0
    assert target_for(state, "fe-1")["overlap_score_credit"] == DESIRED["overlap_score_credit"]
    assert target_for(state.model_copy(update={"mode": "advisory"}), "fe-1") is None
    assert target_for(state.model_copy(update={"rollback": "intent"}), "fe-0") == zero


def test_a_revision_read_before_a_frontend_restart_is_refused_after_it() -> None:
    """Issue 33 item 4: a stalled stale leader read revision n; the frontend restarted under the
    same pod name and the new leader wrote to it n times since. With a revision that restarts
    at 0 the stale PATCH would match and land; with the epoch it is refused."""
    with LoopbackFrontend({"temperature": 1.0}) as fe, RouterClient(leader="old/1") as stale, \
            RouterClient(leader="new/2") as new:
        for _ in range(3):
            stale.patch(fe.url, {}, stale.get(fe.url).revision)
        read = stale.get(fe.url).revision  # then it stalls, past its term check
        fe.restart()
        assert fe.policy.temperature == 1.0 and fe.revision > read, fe.revision
        seen = set()
        for _ in range(read + 2):  # the new incarnation moves at least as often
            seen.add(new.patch(fe.url, {}, new.get(fe.url).revision).revision)
        assert read not in seen, (read, sorted(seen))
        with pytest.raises(RevisionConflict):
            stale.patch(fe.url, {"temperature": 0.0}, read)
        assert fe.policy.temperature == 1.0 and fe.writes[-1].status == 409
        again = fe.revision
        fe.restart()  # every restart takes a new epoch, above every revision of the last one
        assert fe.revision > again and fe.epoch == 2
