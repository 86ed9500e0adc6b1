"""The managed-GPU state file: missing/empty is conclusive, anything odd is inconclusive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerfleet.agent.state import Owner, Record, StateStore, parse_state


def test_missing_file_is_a_conclusive_empty_state(tmp_path: Path) -> None:
    got = StateStore(tmp_path / "nowhere").load()
    assert got.conclusive and got.uuids == frozenset()


def test_empty_file_is_a_conclusive_empty_state(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.path.write_text("")
    got = store.load()
    assert got.conclusive and got.uuids == frozenset()


@pytest.mark.parametrize("text,why", [
    ('{"managed_uuids": ["GPU-1", "GP', "not JSON"),          # truncated
    ('["GPU-1"]', "top level"),
    ('{"managed_uuids": "GPU-1"}', "managed_uuids"),
    ('{"managed_uuids": [1, 2]}', "managed_uuids"),
    ('{"managed_uuids": [""]}', "managed_uuids"),
    ("null", "top level"),
])
def test_malformed_or_wrong_types_are_inconclusive(tmp_path: Path, text: str, why: str) -> None:
    store = StateStore(tmp_path)
    store.path.write_text(text)
    got = store.load()
    assert not got.conclusive and why in got.problem and got.uuids == frozenset()


def test_unreadable_and_non_utf8_files_are_inconclusive(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.path.write_bytes(b"\xff\xfe{")
    assert not store.load().conclusive
    store.path.unlink()
    store.path.mkdir()  # reading a directory: OSError
    assert not store.load().conclusive


def test_save_is_atomic_and_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    record = Record(managed=frozenset({"GPU-b", "GPU-a"}), intent=frozenset({"GPU-c"}), revision=7,
                    targets={"GPU-a": 300_000}, owners={"GPU-a": (Owner("uid-1", "ns", "p"),)})
    store.save(record)
    assert json.loads(store.path.read_text()) == {
        "version": 2, "managed_uuids": ["GPU-a", "GPU-b"], "intent_uuids": ["GPU-c"], "revision": 7,
        "targets": {"GPU-a": 300_000}, "owners": {"GPU-a": [{"uid": "uid-1", "namespace": "ns", "name": "p"}]}}
    loaded = store.load()
    assert loaded.uuids == {"GPU-a", "GPU-b", "GPU-c"} and loaded.record == record  # intent counts as managed
    assert [p.name for p in store.dir.iterdir()] == ["managed_gpus.json"]  # no temp file left


def test_a_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path)
    store.save({"GPU-a"})

    def disk_full(*_a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("powerfleet.agent.files.os.replace", disk_full)
    with pytest.raises(OSError):
        store.save({"GPU-b"})
    monkeypatch.undo()
    assert store.load().uuids == {"GPU-a"}
    assert [p.name for p in tmp_path.iterdir()] == ["managed_gpus.json"]


@given(st.text(max_size=200))
def test_parser_never_raises(text: str) -> None:
    got = parse_state(text)
    assert got.conclusive or got.problem


def test_save_fsyncs_the_file_then_replaces_then_fsyncs_the_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import stat

    from powerfleet.agent import files

    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace(src, dst) -> None:
        calls.append("replace")
        real_replace(src, dst)
    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    StateStore(tmp_path).save({"GPU-1"})
    assert calls == ["fsync-file", "replace", "fsync-dir"]


uuids = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)


@given(st.frozensets(uuids, max_size=4), st.frozensets(uuids, max_size=3), st.integers(0, 2**62),
       st.dictionaries(uuids, st.integers(1, 10**9 - 1), max_size=3),
       st.dictionaries(uuids, st.lists(st.builds(Owner, uuids, st.text(max_size=8), st.text(max_size=8)),
                                       min_size=1, max_size=2).map(tuple), max_size=3))
def test_a_v2_record_round_trips(managed, intent, revision, targets, owners) -> None:
    record = Record(managed, intent - managed, revision, targets, owners)
    loaded = parse_state(record.dump())
    assert loaded.conclusive and loaded.record == record and loaded.uuids == managed | intent


@pytest.mark.parametrize("text,why", [
    ('{"managed_uuids": [], "revision": true}', "revision"),          # a bool is no revision
    ('{"managed_uuids": [], "revision": -1}', "revision"),
    ('{"managed_uuids": [], "targets": {"GPU-1": "300"}}', "targets"),
    ('{"managed_uuids": [], "targets": {"GPU-1": true}}', "targets"),
    ('{"managed_uuids": [], "owners": {"GPU-1": [{"name": "p"}]}}', "owners"),  # an owner needs its uid
    ('{"managed_uuids": [], "intent_uuids": [3]}', "intent_uuids"),
])
def test_mistyped_v2_fields_are_a_lost_record(text: str, why: str) -> None:
    got = parse_state(text)
    assert not got.conclusive and why in got.problem and got.rebuild
