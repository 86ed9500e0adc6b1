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


@pytest.fixture(autouse=True)
def own_agent_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every agent a test starts keeps its state and its node-local lock in a directory of the test's
    own. The default, /var/lib/powerfleet-agent, is the machine's: its ``<node>.lock`` is held by
    any agent for that node on the machine, by design (a second agent for a node refuses to start).
    A test's `up` fleet on node r-a had its agent refused, restarted three times and the fleet
    stopped, while another run of the suite on the machine (another checkout, another xdist worker)
    had an agent on r-a (issue 37)."""
    monkeypatch.setenv("POWERFLEET_AGENT__STATE_DIR", str(tmp_path_factory.mktemp("agent-state")))
