"""The cap policy as a table: pods on a GPU and their annotations -> one decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerfleet.agent.policy import Kind, decide

A, B, C = "pod-a", "pod-b", "pod-c"
SAFE = 500


@pytest.mark.parametrize("pods,annotations,busy,kind,watts", [
    ([], {}, False, Kind.IDLE, None),
    ([A], {A: "300"}, False, Kind.IDLE, None),            # idle GPU keeps its cap
    ([], {}, True, Kind.RELEASE, None),                   # host process only
    ([A], {}, True, Kind.RELEASE, None),                  # pod without the annotation
    ([A, B], {}, True, Kind.RELEASE, None),
    ([A], {A: "300"}, True, Kind.SINGLE, 300),
    ([A], {A: " 350 "}, True, Kind.SINGLE, 350),
    ([A], {A: "abc"}, True, Kind.SAFE_DEFAULT, SAFE),
    ([A], {A: ""}, True, Kind.SAFE_DEFAULT, SAFE),
    ([A], {A: "0"}, True, Kind.SAFE_DEFAULT, SAFE),
    ([A], {A: "3.5e2"}, True, Kind.SAFE_DEFAULT, SAFE),
    ([A, B], {A: "300", B: "300"}, True, Kind.AGREE, 300),
    ([A, B, C], {A: "300", B: "300", C: "300"}, True, Kind.AGREE, 300),
    ([A, B], {A: "300", B: "350"}, True, Kind.CONFLICT, SAFE),
    ([A, B], {A: "300", B: "bad"}, True, Kind.CONFLICT, SAFE),
    ([A, B], {A: "300"}, True, Kind.CONFLICT, SAFE),       # B missing the annotation
    ([A, B], {A: "bad", B: "bad"}, True, Kind.CONFLICT, SAFE),
])
def test_policy_table(pods, annotations, busy, kind, watts) -> None:
    d = decide(pods, annotations, busy=busy, safe_default_watts=SAFE)
    assert (d.kind, d.watts) == (kind, watts)
    assert d.pods == tuple(sorted(set(pods)))


def test_duplicate_pods_count_once() -> None:
    # The same pod listed for several processes is one pod, not an agreement of several.
    d = decide([A, A, A], {A: "300"}, busy=True, safe_default_watts=SAFE)
    assert (d.kind, d.watts, d.pods) == (Kind.SINGLE, 300, (A,))


def test_the_safe_default_is_the_configured_one() -> None:
    assert decide([A], {A: "x"}, busy=True, safe_default_watts=321).watts == 321


@given(st.lists(st.sampled_from([A, B, C]), max_size=6),
       st.dictionaries(st.sampled_from([A, B, C]), st.text(max_size=8)), st.booleans())
def test_any_input_gives_a_decision_and_a_cap_only_from_the_pods_or_the_safe_default(pods, ann, busy) -> None:
    d = decide(pods, ann, busy=busy, safe_default_watts=SAFE)
    if d.watts is not None:
        assert d.watts == SAFE or str(d.watts) in {v.strip() for v in ann.values()} or any(
            v.strip().lstrip("0") == str(d.watts) for v in ann.values())
    assert (d.watts is None) == (d.kind in (Kind.IDLE, Kind.RELEASE))
