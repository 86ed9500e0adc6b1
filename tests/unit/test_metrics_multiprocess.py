"""/metrics in multiprocess mode never fails on a child's file that is still being created."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from powerfleet.metrics.registry import SettledFilesCollector


def _a_childs_counter(tmp_path: Path) -> None:
    # What a child writes: one counter file with its header and a value.
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    d = MmapedDict(str(tmp_path / "counter_4242.db"))
    d.write_value(mmap_key("powerfleet_x_total", "powerfleet_x_total", (), (), ""), 3.0, 0.0)
    d.close()


def test_an_empty_file_of_a_starting_child_is_left_out_and_the_others_are_read(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    _a_childs_counter(tmp_path)
    (tmp_path / "counter_4243.db").write_bytes(b"")  # created, header not yet written

    with pytest.raises(struct.error):  # prometheus_client's own collector fails the whole scrape
        stock = CollectorRegistry()
        multiprocess.MultiProcessCollector(stock, path=str(tmp_path))
        generate_latest(stock)

    registry = CollectorRegistry()
    SettledFilesCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    assert "powerfleet_x_total 3.0" in text, text
