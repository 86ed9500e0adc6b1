"""Overlays carry no authority (issue 29 item 2; power/authority.py): an agent applies the guard's record
for its node, under the record's epoch and revision, and refuses, one reason each, anything else."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from powerfleet.power.authority import REASONS, parse_record, record_json, verify
from powerfleet.power.guard import GuardSettings
from powerfleet.power.live import GroupView, GuardMemory, guard_period
from powerfleet.power.overlay import Overlay
from tests.power.test_live import VIEW, reports

S = GuardSettings(period_s=1.0)


def period_and_record() -> tuple[dict[str, Overlay], str]:
    p = guard_period(S, "rack", 2000.0, VIEW, reports(490.0, 100.0), GuardMemory(), now=100.0)
    return p.overlays, record_json(p.overlays, p.memory.epoch, p.memory.revision, 1.0, 100.0)


def test_the_guards_own_message_is_applied_as_its_record_says() -> None:
    overlays, raw = period_and_record()
    sent = overlays["node-a"]
    assert sent.epoch == "186a0" and sent.caps  # the memory's epoch: its first period (100,000 ms)
    got, why = verify(sent, raw, {"rack"}, 1.0)
    assert why is None and got == sent


def test_a_forged_throttle_changes_nothing_and_says_why() -> None:
    overlays, raw = period_and_record()
    sent = overlays["node-a"]
    forged = {"node": "node-a", "group": "rack", "caps": {"a0": 1.0, "a1": 1.0}, "safe": {"a0": 1.0, "a1": 1.0},
              "period_s": 3600.0, "revision": 10**18, "issued_at": 0.0}
    cases = {
        "period": Overlay(**forged),  # the message of issue 29: period 3600 s, revision 10^18, caps 1 W
        "future_revision": Overlay(**{**forged, "period_s": 1.0, "epoch": sent.epoch}),
        "foreign_epoch": Overlay(**{**forged, "period_s": 1.0, "revision": sent.revision, "epoch": "beef"}),
        "superseded": Overlay(**{**forged, "period_s": 1.0, "revision": sent.revision - 1, "epoch": sent.epoch}),
        "unknown_group": Overlay(**{**forged, "group": "rack-z", "period_s": 1.0}),
        "unknown_node": Overlay(**{**forged, "node": "node-z", "period_s": 1.0, "revision": sent.revision,
                                   "epoch": sent.epoch}),
    }
    for reason, message in cases.items():
        assert verify(message, raw, {"rack"}, 1.0) == (None, reason), reason
    # its epoch and revision right, its caps forged: the record's caps are what is applied
    guessed = Overlay(**{**forged, "period_s": 1.0, "revision": sent.revision, "epoch": sent.epoch})
    assert verify(guessed, raw, {"rack"}, 1.0) == (sent, None)
    # no record (the guard is down, its record expired; Redis unreachable): nothing to apply
    assert verify(sent, None, {"rack"}, 1.0) == (None, "no_record")
    assert set(REASONS) >= {why for _, why in (verify(m, raw, {"rack"}, 1.0) for m in cases.values())}


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300),
                 st.dictionaries(st.sampled_from(["epoch", "revision", "period_s", "issued_at", "nodes"]),
                                 st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=4),
                                           st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
                                 ).map(json.dumps)))
@example('{"epoch":null,"revision":Infinity}')  # found by CI: int(inf) raised OverflowError out of the parser
def test_the_record_parser_never_raises_and_a_bad_record_authorises_nothing(raw) -> None:  # type: ignore[no-untyped-def]
    rec = parse_record(raw)
    overlays, _ = period_and_record()
    got, why = verify(overlays["node-a"], raw, {"rack"}, 1.0)
    assert (got is None) == (why is not None)
    if rec is None:
        assert why == "no_record"


def test_a_record_is_read_field_by_field_and_never_coerced() -> None:
    overlays, raw = period_and_record()
    good = json.loads(raw)
    assert parse_record(raw) is not None
    for field, bad in [("epoch", None), ("epoch", 7), ("revision", 2.5), ("revision", True), ("revision", "3"),
                       ("period_s", True), ("period_s", "1"), ("period_s", 0), ("issued_at", None),
                       ("nodes", []), ("nodes", {"node-a": 1})]:
        assert parse_record(json.dumps({**good, field: bad})) is None, (field, bad)
    for bad_json in ('{"epoch":null,"revision":Infinity}', '{"revision":NaN}', "[1]", '"x"', "1e999"):
        assert parse_record(bad_json) is None, bad_json
    # a null epoch is no record, not the epoch "None" a message could name
    assert verify(overlays["node-a"].model_copy(update={"epoch": "None"}),
                  json.dumps({**good, "epoch": None}), {"rack"}, 1.0) == (None, "no_record")


def test_an_epoch_lasts_as_long_as_the_guards_memory() -> None:
    p = guard_period(S, "rack", 2000.0, VIEW, reports(490.0, 100.0), GuardMemory(), now=100.0)
    memory = GuardMemory.from_json(json.loads(json.dumps(p.memory.to_json())))
    nxt = guard_period(S, "rack", 2000.0, VIEW, reports(490.0, 101.0), memory, now=101.0)
    assert nxt.memory.epoch == p.memory.epoch == "186a0"
    assert {o.epoch for o in nxt.overlays.values()} == {"186a0"}
    fresh = guard_period(S, "rack", 2000.0, GroupView(nodes=VIEW.nodes, priority=VIEW.priority),
                         reports(490.0, 102.0), GuardMemory(), now=102.0)
    assert fresh.memory.epoch != p.memory.epoch  # memory lost: a new epoch


def test_the_period_is_bounded_by_the_agents_configuration() -> None:
    overlays, raw = period_and_record()
    assert verify(overlays["node-a"], raw, {"rack"}, 0.5) == (None, "period")
    got, why = verify(overlays["node-a"], raw, {"rack"}, 2.0)
    assert why is None and got is not None and got.period_s == 1.0


def test_status_puts_each_overlay_in_force_in_one_line() -> None:
    from powerfleet.cli.status_cmd import overlay_lines

    assert overlay_lines([]) == ["power overlays: none in force"]
    line, = overlay_lines([{"node": "gpu-a", "group": "rack-a", "source": "guard epoch 186a0", "revision": 100_000,
                            "throttled": 1, "gpus": 2, "caps": {"GPU-0": 595.0}, "expires_in_s": 1.234}])
    assert line == ("power overlay on gpu-a: group rack-a, 1 of 2 GPUs throttled, from guard epoch 186a0 revision "
                    "100000, expires in 1.2 s")
