"""The replica-count record an evaluation leaves in Redis (budget/state.py): any bytes give the
counts and epoch, or None (re-derive from the cluster), never an exception that stops scaling."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.budget.state import _replicas_record

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
