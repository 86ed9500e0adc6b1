from __future__ import annotations

import os
from pathlib import Path

import pytest

from powerfleet.sim.trace import read_trace

DATA = Path(__file__).resolve().parent / "data"
TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
TINY = DATA / "tiny_trace.jsonl"


@pytest.fixture(scope="session")
def tiny_requests():
    return read_trace(TINY).requests


def need_trace(name: str, traces: Path = TRACES) -> Path:
    """A shared trace beside the clone; skipped locally when absent, a failure under CI=true
    (where a missing ../shared must not pass silently)."""
    p = traces / name
    if not p.exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"shared trace {name} missing under CI=true (expected at {p})")
        pytest.skip(f"shared trace {name} not present beside the clone")
    return p
