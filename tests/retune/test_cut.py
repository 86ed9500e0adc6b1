"""The window cut: streaming merge of gzip segments, corrupt members skipped, paths confined."""

from __future__ import annotations

import gzip
import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerfleet.retune.cut import CutError, cut_window
from powerfleet.sim.trace import read_trace


def line(ts_ms: float, n: int = 1) -> str:
    return json.dumps({"timestamp": ts_ms, "input_length": 512 * n, "output_length": 4, "hash_ids": list(range(n))})


def member(*ts: float) -> bytes:
    return gzip.compress(("\n".join(line(t) for t in ts) + "\n").encode())


def seg(root: Path, dgd: str, pod: str, name: str, data: bytes) -> Path:
    d = root / "segments" / dgd / pod
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)
    return d / name


def timestamps(path: str) -> list[float]:
    return sorted(r.timestamp_ms for r in read_trace(path, strict=True).requests)


def test_merges_pods_keeps_the_window_and_writes_0600(tmp_path: Path) -> None:
    seg(tmp_path, "llama", "fe-0", "a.jsonl.gz", member(999, 1000, 5000) + member(9999, 10_000))
    seg(tmp_path, "llama", "fe-1", "b.jsonl", (line(2000) + "\n" + line(3000) + "\nnot json\n").encode())
    res = cut_window(tmp_path, "llama", 7, 1.0, 10.0)
    assert res.path is not None and timestamps(res.path) == [1000, 2000, 3000, 5000, 9999]
    assert (res.requests, res.segments, res.malformed_lines, res.corrupt_members) == (5, 2, 1, 0)
    assert stat.S_IMODE(os.stat(res.path).st_mode) == 0o600
    assert res.path.endswith("windows/llama/w7.jsonl.gz")


@pytest.mark.parametrize("damage", ["crc", "truncated", "garbage-between"])
def test_a_corrupt_member_is_skipped_and_counted_the_rest_kept(tmp_path: Path, damage: str) -> None:
    good1, good2 = member(1000, 2000), member(4000)
    bad = bytearray(member(3000, 3500))
    if damage == "crc":
        bad[-6] ^= 0xFF
    elif damage == "truncated":
        bad = bad[: len(bad) // 2]
    else:
        bad = bytearray(b"\x00junk-bytes") + bad
    seg(tmp_path, "llama", "fe-0", "a.jsonl.gz", good1 + bytes(bad) + good2)
    res = cut_window(tmp_path, "llama", 0, 0.0, 10.0)
    expected = [1000, 2000, 3000, 3500, 4000] if damage == "garbage-between" else [1000, 2000, 4000]
    assert timestamps(res.path) == expected
    assert res.corrupt_members == 1 and res.issues


def test_an_empty_window_writes_no_file(tmp_path: Path) -> None:
    seg(tmp_path, "llama", "fe-0", "a.jsonl.gz", member(50_000))
    res = cut_window(tmp_path, "llama", 0, 0.0, 10.0)
    assert res.path is None and res.requests == 0
    assert not any((tmp_path / "windows" / "llama").iterdir())


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", "UPPER", "", "x" * 300, "a..b"])
def test_names_cannot_escape_the_trace_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(CutError):
        cut_window(tmp_path, name, 0, 0.0, 10.0)


def test_symlinked_pod_directories_and_files_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.jsonl.gz").write_bytes(member(1000))
    root = tmp_path / "traces"
    seg(root, "llama", "fe-0", "a.jsonl.gz", member(2000))
    (root / "segments" / "llama" / "evil").symlink_to(outside)
    (root / "segments" / "llama" / "fe-0" / "link.jsonl.gz").symlink_to(outside / "x.jsonl.gz")
    res = cut_window(root, "llama", 0, 0.0, 10.0)
    assert timestamps(res.path) == [2000]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(st.lists(st.integers(0, 20_000), min_size=1, max_size=5), min_size=1, max_size=4),
       noise=st.binary(max_size=64), where=st.integers(0, 3), flip=st.integers(0, 400))
def test_fuzzed_segments_never_leak_out_of_window_or_corrupt_records(tmp_path_factory, members, noise, where, flip) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    parts = [bytearray(member(*m)) for m in members]
    i = where % len(parts)
    if flip < len(parts[i]):
        parts[i][flip] ^= 0x5A
    blob = b"".join(bytes(p) for p in parts[:i]) + noise + b"".join(bytes(p) for p in parts[i:])
    seg(root, "d", "p", "s.jsonl.gz", blob)
    res = cut_window(root, "d", 0, 1.0, 15.0)  # never raises on bad bytes
    got = timestamps(res.path) if res.path else []
    assert all(1000 <= t < 15_000 for t in got)
    everything = sorted(t for m in members for t in m if 1000 <= t < 15_000)
    assert set(got) <= set(everything) and len(got) <= len(everything)


@pytest.mark.parametrize("cut_bytes", [1, 4, 8, 12, "half"])
def test_a_member_cut_short_at_the_end_of_a_segment_stays_out_of_the_window(tmp_path: Path, cut_bytes) -> None:
    """What a frontend killed mid-write (or a segment still being written) leaves: the last
    member lacks its trailer or part of its deflate stream. Its lines decompress, but none of
    them may reach the window; everything before it, and the next segment, is kept."""
    last = member(3000, 3500)
    n = len(last) // 2 if cut_bytes == "half" else cut_bytes
    seg(tmp_path, "llama", "fe-0", "a.jsonl.gz", member(1000, 2000) + last[: len(last) - n])
    seg(tmp_path, "llama", "fe-0", "b.jsonl.gz", member(4000))
    res = cut_window(tmp_path, "llama", 0, 0.0, 10.0)
    assert res.path is not None and timestamps(res.path) == [1000, 2000, 4000]
    assert res.corrupt_members == 1 and "a.jsonl.gz" in res.issues[0]


def test_a_cut_reads_only_segments_written_since_its_warm_up_and_prunes_expired_ones(tmp_path: Path) -> None:
    old = seg(tmp_path, "llama", "fe-0", "old.jsonl.gz", member(500))
    expired = seg(tmp_path, "llama", "fe-0", "expired.jsonl.gz", member(600))
    live = seg(tmp_path, "llama", "fe-0", "live.jsonl.gz", member(4000, 9000))
    os.utime(old, (3.0, 3.0))  # last written at 3 s: before the warm-up span [4 s, 10 s)
    os.utime(expired, (1.0, 1.0))
    os.utime(live, (20.0, 20.0))
    res = cut_window(tmp_path, "llama", 1, 7.0, 10.0, warmup_s=3.0, retention_s=60.0, now_s=62.0)
    assert (res.segments, res.segments_skipped, res.segments_pruned) == (1, 1, 1)
    assert not expired.exists() and old.exists()
    assert timestamps(res.path) == [4000, 9000] and (res.requests, res.warmup_requests) == (1, 1)
    assert res.first_ms == 4000


def test_a_recreated_dgd_cuts_nothing_from_before_its_own_lifetime(tmp_path: Path) -> None:
    """Issue 33 item 1: segments are kept by name; ``not_before_s`` (the state's ``dgd_since``)
    leaves the earlier object's records out, warm-up included."""
    seg(tmp_path, "llama", "fe-0", "a.jsonl.gz", member(500, 1500, 4000, 6000, 9000))
    old = cut_window(tmp_path, "llama", 1, 5.0, 10.0, warmup_s=5.0)
    assert old.path is not None and timestamps(old.path) == [500, 1500, 4000, 6000, 9000]
    new = cut_window(tmp_path, "llama", 2, 5.0, 10.0, warmup_s=5.0, not_before_s=4.5)
    assert new.path is not None and timestamps(new.path) == [6000, 9000], new
    assert (new.requests, new.warmup_requests) == (2, 0), new
    late = cut_window(tmp_path, "llama", 3, 5.0, 10.0, warmup_s=5.0, not_before_s=7.0)
    assert late.path is not None and timestamps(late.path) == [9000] and late.requests == 1, late
