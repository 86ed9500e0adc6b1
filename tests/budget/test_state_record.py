"""The replica-count record an evaluation leaves in Redis (budget/state.py): any bytes give the
counts and epoch, or None (re-derive from the cluster), never an exception that stops scaling; and
the same for the proposals and admissions."""

from __future__ import annotations

import json
import logging

import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.state import ADMITTED, PROPOSALS, BudgetState, _admitted_record, _proposal_record, _replicas_record
from powerfleet.cluster.dgd import parse_dgd
from powerfleet.cluster.immutability import AdmittedPowerInputs, admit_power_inputs
from powerfleet.testing.budget.stand_in_operator import dgd

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=12)


def test_both_record_shapes_read_and_a_foreign_one_is_ignored() -> None:
    assert _replicas_record(b'{"counts": {"decode": 2}, "epoch": "abc"}') == ({"decode": 2}, "abc")
    assert _replicas_record(b'{"decode": 2, "prefill": 1}') == ({"decode": 2, "prefill": 1}, None)
    for raw in (b"[1, 2]", b'{"decode": "2"}', b'{"decode": -1}', b'{"counts": {"decode": 1}, "epoch": 5}',
                b"\xff\xfe", b"not json", b"[" * 100_000):
        assert _replicas_record(raw) is None, raw


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode())))
def test_any_stored_bytes_read_as_a_record_or_none(raw: bytes) -> None:
    got = _replicas_record(raw)
    if got is not None:
        counts, epoch = got
        assert all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in counts.items())
        assert epoch is None or isinstance(epoch, str)
ADMITTED_JSON = {"namespace": "default", "name": "llama", "uid": "u", "generation": 1, "components": {}}


# --- proposals and admissions: a corrupt or foreign record is skipped, never raised -----------


def test_a_proposal_record_reads_its_counts_and_a_foreign_one_is_none() -> None:
    assert _proposal_record(b'{"replicas": {"decode": 2}, "at": 1.0, "source": "load"}') == {"decode": 2}
    for raw in (b"[]", b'{"replicas": [2]}', b'{"replicas": {"decode": "2"}}', b'{"replicas": {"decode": true}}',
                b'{"replicas": {"decode": -1}}', b'{"replicas": {"decode": 100001}}', b'{"decode": 2}', b"\xff",
                b"not json", b"[" * 100_000):
        assert _proposal_record(raw) is None, raw


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                 json_values.map(lambda v: json.dumps({"replicas": v}).encode())))
def test_any_stored_bytes_read_as_a_proposal_or_none(raw: bytes) -> None:
    got = _proposal_record(raw)
    assert got is None or all(isinstance(k, str) and type(v) is int and 0 <= v <= 100_000 for k, v in got.items())


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode()),
                 json_values.map(lambda v: json.dumps({**ADMITTED_JSON, "power": v}).encode())))
def test_any_stored_bytes_read_as_an_admission_or_none(raw: bytes) -> None:
    got = _admitted_record(raw)
    assert got is None or isinstance(got, AdmittedPowerInputs)


def test_corrupt_records_in_redis_are_skipped_with_one_warning(broker_url: str, caplog) -> None:
    state = BudgetState(redis.Redis.from_url(broker_url))
    good = admit_power_inputs(parse_dgd(dgd("llama", 1, 1)))
    state.propose("default/llama", {"decode": 3}, at=1.0, source="test")
    state.admit("default/llama", good)
    client = redis.Redis.from_url(broker_url)
    for key, raw in ((PROPOSALS, b"not json"), (PROPOSALS, b'{"replicas": {"decode": "x"}}'), (ADMITTED, b"[1]")):
        client.hset(key, f"default/bad-{len(raw)}", raw)
    with caplog.at_level(logging.WARNING, logger="powerfleet.budget"):
        assert state.proposals() == {"default/llama": {"decode": 3}}
        assert state.all_admitted() == {"default/llama": good}
        assert state.proposal("default/bad-8") is None and state.admitted("default/bad-3") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and "default/bad-29, default/bad-8" in lines[0], lines  # one line per read
