"""Suite-wide fixtures: only what keeps one test's process-global state out of the next."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


# The end-to-end files that take a minute or more each (a demo, a fleet through a failover):
# marked `slow` (`-m "not slow"` for a quick pass) and scheduled first, so that under pytest-xdist
# they do not form the suite's tail. Figures in docs/benchmarks.md, "The test suite".
SLOW = (
    "integration/test_scenario_demo.py", "integration/test_up_and_demo.py", "integration/test_up_hardening.py",
    "power/test_oversubscribe_demo.py", "reliability/test_sentinel_failover.py", "reliability/test_beat_failover.py",
    "reliability/test_redis_restart.py", "reliability/test_agent_sigkill.py", "retune/test_live_e2e.py",
    "budget/test_generations_end_to_end.py",
)
# The files that run a whole time-compressed demo (a twin, a fleet, a scenario at 10x): one unit
# under pytest-xdist, one after another, so that two demos never starve each other of CPU (side by
# side with -n 3 on 2 loaded cores, a sweep shard hit its soft time limit in one and a rack sample
# went over its limit in the other).
DEMOS = ("integration/test_scenario_demo.py", "integration/test_up_and_demo.py", "power/test_oversubscribe_demo.py")
_TESTS = Path(__file__).parent


def _rel(item: pytest.Item) -> str:
    path = Path(item.path)
    return path.relative_to(_TESTS).as_posix() if _TESTS in path.parents else path.name


def _order(item: pytest.Item) -> int:
    return 0 if item.get_closest_marker("control_plane") else 1 if item.get_closest_marker("slow") else 2


def pytest_itemcollected(item: pytest.Item) -> None:
    rel = _rel(item)
    if rel.startswith("control_plane/") and not item.get_closest_marker("control_plane"):
        item.add_marker(pytest.mark.control_plane)  # also marked by its conftest, after this hook
    if rel in SLOW:
        item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The control_plane tier first, then the slow files, then the rest (each in collection order):
    under pytest-xdist the longest units start first, so no worker is left with one at the end."""
    items.sort(key=_order)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`make test` (``-n N --dist loadscope``): each test file is one unit of work, run whole by one
    worker (its module-scoped fixtures set up once); the control_plane tier is one unit (one real
    control plane per session, not one per worker), and so are the DEMOS. xdist's own
    ``loadgroup`` would say this with markers, but with pytest 9.2 it ignores them (it renames
    ``item._nodeid``, which ``nodeid`` no longer reads)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.startswith("tests/control_plane/"):
                return "tests/control_plane"
            return "demos" if path.removeprefix("tests/") in DEMOS else path

    return ByFile(config, log)
