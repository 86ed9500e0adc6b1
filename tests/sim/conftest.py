from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.sim.trace import read_trace

DATA = Path(__file__).resolve().parent / "data"
TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
TINY = DATA / "tiny_trace.jsonl"


@pytest.fixture(scope="session")
def tiny_requests():
    return read_trace(TINY).requests


def need_trace(name: str) -> Path:
    p = TRACES / name
    if not p.exists():
        pytest.skip(f"shared trace {name} not present beside the clone")
    return p
