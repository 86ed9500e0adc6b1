"""Trace reader: plain, gzip, multi-member gzip, malformed lines, corrupt members."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerfleet.sim.trace import TraceError, TraceRequest, dumps_request, read_trace, select_window

from .conftest import TINY


def _line(ts: int, isl: int = 600, osl: int = 5, hashes: tuple[int, ...] = (1, 2)) -> str:
    return json.dumps({"timestamp": ts, "input_length": isl, "output_length": osl, "hash_ids": list(hashes)})


def test_tiny_fixture_reads_clean() -> None:
    tr = read_trace(TINY)
    assert len(tr.requests) == 60
    assert tr.issues == []
    assert tr.requests[0].session_id == "s1"
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in tr.requests)


def test_malformed_lines_are_counted_with_line_numbers_and_skipped(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        "\n".join(
            [
                _line(0),
                "{not json",
                json.dumps({"timestamp": 5, "input_length": "12", "output_length": 3, "hash_ids": [1]}),
                "",
                json.dumps({"timestamp": 5, "input_length": 12, "output_length": 3, "hash_ids": [1.5]}),
                "[1, 2]",
                _line(10),
            ]
        )
        + "\n"
    )
    tr = read_trace(p)
    assert [r.timestamp_ms for r in tr.requests] == [0.0, 10.0]
    assert [i.where for i in tr.issues] == [2, 3, 5, 6]
    assert str(tr.issues[1]) == "trace line 3: input_length must be a non-negative integer"
    assert tr.malformed_lines == 4
    with pytest.raises(TraceError, match="trace line 2"):
        read_trace(p, strict=True)


def test_gzip_multi_member_and_corrupt_member_is_skipped_without_losing_later_ones(tmp_path: Path) -> None:
    m1 = gzip.compress((_line(0) + "\n" + _line(1) + "\n").encode())
    m2 = bytearray(gzip.compress(("\n".join(_line(100 + i) for i in range(50)) + "\n").encode()))
    m2[len(m2) // 2] ^= 0xFF  # corrupt the deflate data of member 2
    m3 = gzip.compress((_line(200) + "\n" + _line(201)).encode())  # no final newline
    p = tmp_path / "t.jsonl.gz"
    p.write_bytes(m1 + bytes(m2) + m3)
    tr = read_trace(p)
    assert [r.timestamp_ms for r in tr.requests] == [0.0, 1.0, 200.0, 201.0]
    assert tr.corrupt_members == 1
    assert tr.issues[0].where == len(m1)
    with pytest.raises(TraceError, match="gzip member at byte"):
        read_trace(p, strict=True)


def test_truncated_last_member_is_reported(tmp_path: Path) -> None:
    m1 = gzip.compress((_line(0) + "\n").encode())
    m2 = gzip.compress((_line(5) + "\n").encode())[:-6]
    p = tmp_path / "t.gz"
    p.write_bytes(m1 + m2)
    tr = read_trace(p)
    assert [r.timestamp_ms for r in tr.requests] == [0.0]
    assert tr.corrupt_members == 1 and "truncated" in tr.issues[0].message


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open trace"):
        read_trace(tmp_path / "nope.jsonl")


def test_window_selects_by_seconds_from_first_timestamp() -> None:
    reqs = [TraceRequest(float(t), 10, 1, (1,)) for t in (5000, 6000, 7000, 9000)]
    assert [r.timestamp_ms for r in select_window(reqs, 1, 4)] == [6000.0, 7000.0]
    assert [r.timestamp_ms for r in select_window(reqs, None, 1)] == [5000.0]


_req = st.builds(
    TraceRequest,
    timestamp_ms=st.integers(0, 10**9).map(float),
    input_length=st.integers(0, 10**6),
    output_length=st.integers(0, 10**5),
    hash_ids=st.lists(st.integers(0, 2**40), max_size=20).map(tuple),
    session_id=st.none() | st.text(min_size=1, max_size=8),
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    reqs=st.lists(_req, max_size=25),
    members=st.integers(1, 4),
    garbage=st.lists(st.integers(0, 30), max_size=4),
    zipped=st.booleans(),
)
def test_reader_round_trips_and_reports_every_bad_line(tmp_path: Path, reqs, members, garbage, zipped) -> None:
    lines = [dumps_request(r) for r in reqs]
    bad_positions = sorted({min(g, len(lines)) for g in garbage})
    out: list[str] = []
    expected_bad: list[int] = []
    for i, ln in enumerate(lines + [None]):
        while bad_positions and bad_positions[0] == i:
            bad_positions.pop(0)
            out.append('{"timestamp": -1}')
            expected_bad.append(len(out))
        if ln is not None:
            out.append(ln)
    text = "".join(x + "\n" for x in out)
    p = tmp_path / ("t.gz" if zipped else "t.jsonl")
    if zipped:
        # split the text into several gzip members at line boundaries
        step = max(1, len(out) // members)
        chunks = [out[i : i + step] for i in range(0, len(out), step)] or [[]]
        p.write_bytes(b"".join(gzip.compress("".join(x + "\n" for x in c).encode()) for c in chunks))
    else:
        p.write_text(text)
    tr = read_trace(p)
    assert [(r.timestamp_ms, r.input_length, r.output_length, r.hash_ids, r.session_id) for r in tr.requests] == [
        (r.timestamp_ms, r.input_length, r.output_length, r.hash_ids, r.session_id) for r in reqs
    ]
    assert [i.where for i in tr.issues] == expected_bad


def test_a_fake_gzip_header_is_not_trusted_before_its_member_decompresses(tmp_path: Path) -> None:
    # After a corrupt member the reader looks for the next gzip header; one that appears in
    # garbage must be checked by decompressing its member, not trusted for its magic bytes.
    m1 = gzip.compress((_line(0) + "\n").encode())
    m2 = bytearray(gzip.compress(("\n".join(_line(100 + i) for i in range(50)) + "\n").encode()))
    m2[len(m2) // 2] ^= 0xFF
    fake = b"\x1f\x8b\x08\x00junk that is not deflate data" * 2
    m3 = gzip.compress((_line(300) + "\n").encode())
    p = tmp_path / "t.gz"
    p.write_bytes(m1 + bytes(m2) + fake + m3)
    tr = read_trace(p)
    assert [r.timestamp_ms for r in tr.requests] == [0.0, 300.0]
    assert [i.where for i in tr.issues] == [len(m1)]  # one corrupt region, not one per fake header


def test_a_member_whose_crc_fails_releases_none_of_its_lines(tmp_path: Path) -> None:
    m1 = gzip.compress((_line(0) + "\n").encode())
    m2 = bytearray(gzip.compress(("\n".join(_line(100 + i) for i in range(5)) + "\n").encode()))
    m2[-8] ^= 0x01  # the CRC32 trailer: the deflate data itself decompresses fine
    m3 = gzip.compress((_line(300) + "\n").encode())
    p = tmp_path / "t.gz"
    p.write_bytes(m1 + bytes(m2) + m3)
    tr = read_trace(p)
    assert [r.timestamp_ms for r in tr.requests] == [0.0, 300.0] and tr.corrupt_members == 1
