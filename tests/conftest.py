"""Suite-wide fixtures: only what keeps one test's process-global state out of the next."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from powerfleet.retune import leadership


@pytest.fixture(autouse=True)
def fresh_lease_observations() -> Iterator[None]:
    """Leadership keeps per-process observations of Leases on the local monotonic clock. Tests
    give each elector a fake clock and a fresh API server, whose resourceVersions repeat: an
    observation left by an earlier test in the same process would read as an old timer on the
    new Lease (seen under pytest-xdist, where the order of files in a process changes)."""
    leadership._SEEN.clear()
    leadership._RENEWED.clear()
    yield
