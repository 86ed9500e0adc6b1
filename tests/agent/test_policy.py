"""The cap policy as a table: pods on a GPU and their annotations -> one decision."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.agent.catalog import CardRange, card_range, product_range_w, safe_default_mw
from powerfleet.agent.policy import Kind, decide

A, B, C = "pod-a", "pod-b", "pod-c"
SAFE = 490_000


@pytest.mark.parametrize("pods,annotations,busy,kind,watts", [
    ([], {}, False, Kind.IDLE, None),
    ([A], {A: "300"}, False, Kind.IDLE, None),            # idle GPU keeps its cap
    ([A], {}, True, Kind.RELEASE, None),                  # pod without the annotation
    ([A, B], {}, True, Kind.RELEASE, None),
    ([A], {A: "300"}, True, Kind.SINGLE, 300),
    ([A], {A: " 350 "}, True, Kind.SINGLE, 350),
    ([A], {A: "abc"}, True, Kind.SAFE_DEFAULT, SAFE // 1000),
    ([A], {A: ""}, True, Kind.SAFE_DEFAULT, SAFE // 1000),
    ([A], {A: "0"}, True, Kind.SAFE_DEFAULT, SAFE // 1000),
    ([A], {A: "3.5e2"}, True, Kind.SAFE_DEFAULT, SAFE // 1000),
    ([A, B], {A: "300", B: "300"}, True, Kind.AGREE, 300),
    ([A, B, C], {A: "300", B: "300", C: "300"}, True, Kind.AGREE, 300),
    ([A, B], {A: "300", B: "350"}, True, Kind.CONFLICT, 300),  # the lowest valid cap, not a higher default
    ([A, B], {A: "300", B: "bad"}, True, Kind.CONFLICT, 300),  # never above a valid cap involved
    ([A, B], {A: "600", B: "bad"}, True, Kind.CONFLICT, SAFE // 1000),
    ([A, B], {A: "300"}, True, Kind.CONFLICT, 300),       # B missing the annotation
    ([A, B], {A: "bad", B: "bad"}, True, Kind.CONFLICT, SAFE // 1000),
])
def test_policy_table(pods, annotations, busy, kind, watts) -> None:
    listed = set(pods) | set(annotations)
    d = decide(pods, annotations, busy=busy, safe_default_mw=SAFE, listed=listed)
    assert (d.kind, None if d.requested_mw is None else d.requested_mw // 1000) == (kind, watts)
    assert d.pods == tuple(sorted(set(pods)))


def test_duplicate_pods_count_once() -> None:
    # The same pod listed for several processes is one pod, not an agreement of several.
    d = decide([A, A, A], {A: "300"}, busy=True, safe_default_mw=SAFE)
    assert (d.kind, d.requested_mw, d.pods) == (Kind.SINGLE, 300_000, (A,))


def test_processes_of_an_unknown_owner_take_the_safe_default_and_are_never_released() -> None:
    # A host process or an unreadable /proc entry, and no opted-in pod: safe by default.
    for d in (decide([], {}, busy=True, safe_default_mw=SAFE, unmapped=2),
              decide([A], {}, busy=True, safe_default_mw=SAFE, unmapped=1, listed={A})):
        assert (d.kind, d.requested_mw, d.unknown_owner) == (Kind.SAFE_DEFAULT, SAFE, True), d
    # A blind proc root cannot attribute anything: the cap stays.
    d = decide([], {}, busy=True, safe_default_mw=SAFE, unmapped=2, blind=True)
    assert (d.kind, d.requested_mw) == (Kind.HOLD, None), d
    # With an opted-in pod beside them, the unattributed process counts as a pod without a value.
    d = decide([A], {A: "600"}, busy=True, safe_default_mw=SAFE, unmapped=1, listed={A})
    assert (d.kind, d.requested_mw, d.unattributed) == (Kind.CONFLICT, SAFE, 1)


def test_only_a_complete_view_confirms_a_pod_is_gone() -> None:
    # A is not in the view: with every namespace listed it is gone (release); with a namespace
    # scope it may just be unseen: an unknown owner (the safe default).
    assert decide([A], {}, busy=True, safe_default_mw=SAFE, listed=set(), complete=True).kind is Kind.RELEASE
    assert decide([A], {}, busy=True, safe_default_mw=SAFE, listed=set(), complete=False).kind is Kind.SAFE_DEFAULT
    d = decide([A, B], {B: "300"}, busy=True, safe_default_mw=SAFE, listed={B}, complete=False)
    assert (d.kind, d.requested_mw) == (Kind.CONFLICT, 300_000)


@pytest.mark.parametrize("name,device,override,expected_w", [
    ("NVIDIA H200", (200, 700), None, 490),
    ("NVIDIA L40S", (100, 350), 500, 245),      # the chart's 500 W is no cap on an L40S: 0.7 x 350
    ("NVIDIA A100 80GB PCIe", (150, 300), 500, 210),
    ("NVIDIA L4", (40, 72), 500, 50.4),
    ("NVIDIA L4", (40, 72), 60, 60),            # an override inside the range is used
    ("NVIDIA A100-SXM4-80GB", (100, 400), 50, 100),  # clamped up into the range
    ("NVIDIA H100 PCIe", (200, 400), None, 245),     # the catalog narrows the device's 400 W to 350
])
def test_the_safe_default_is_safe_on_the_card(name, device, override, expected_w) -> None:
    rng = card_range(device[0] * 1000, device[1] * 1000, name)
    mw = safe_default_mw(rng, fraction=0.7, override_w=override)
    assert mw / 1000 == expected_w
    assert rng.min_mw <= mw < rng.max_mw


def test_catalog_products_and_ranges() -> None:
    assert product_range_w("NVIDIA GB200") == (200, 1200) and product_range_w("NVIDIA B200") == (200, 1000)
    assert product_range_w("NVIDIA L40") == (100, 300) and product_range_w("Tesla T4") is None
    assert product_range_w("NVIDIA GH200 480GB") == (100, 900)  # never H200's 200-700 (whole words)
    assert not card_range(200_000, 400_000, "NVIDIA H100 PCIe").qualified


@settings(max_examples=150)
@given(st.integers(1_000, 1_000_000), st.integers(0, 1_000_000), st.floats(0.05, 0.95),
       st.one_of(st.none(), st.integers(1, 100_000)))
def test_the_safe_default_is_never_at_or_above_the_maximum(lo, span, fraction, override) -> None:
    rng = CardRange(lo, lo + span, True)
    mw = safe_default_mw(rng, fraction=fraction, override_w=override)
    assert rng.min_mw <= mw <= rng.max_mw
    if span > 0:
        assert mw < rng.max_mw


@settings(max_examples=150)
@given(st.lists(st.sampled_from([A, B, C]), max_size=6),
       st.dictionaries(st.sampled_from([A, B, C]), st.text(max_size=8)), st.booleans(), st.integers(0, 3),
       st.booleans())
def test_any_input_gives_a_decision_never_above_a_valid_cap_involved(pods, ann, busy, unmapped, complete) -> None:
    d = decide(pods, ann, busy=busy, safe_default_mw=SAFE, unmapped=unmapped, listed=set(ann), complete=complete)
    # What the annotation's grammar calls a number: ASCII digits inside ASCII whitespace. (str.isdigit
    # and str.strip take '²' and '\x1f', which int() refuses: the oracle itself failed now and then.)
    ws = " \t\r\n\f\v"
    valid = [int(v.strip(ws)) * 1000 for u, v in ann.items()
             if u in pods and v.strip(ws).isascii() and v.strip(ws).isdigit() and int(v.strip(ws)) > 0]
    if d.requested_mw is not None:
        assert d.requested_mw == SAFE or d.requested_mw in valid
        assert all(d.requested_mw <= v for v in valid) or d.kind is Kind.SINGLE
    assert (d.requested_mw is None) == (d.kind in (Kind.IDLE, Kind.RELEASE, Kind.HOLD))
    if unmapped and busy:
        assert d.kind is not Kind.RELEASE  # processes it cannot attribute never lose their cap
