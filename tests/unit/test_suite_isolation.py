"""The suite keeps what one test's processes share on the machine out of every other test's."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.config import load_config
from powerfleet.config.fleet import AgentConfig
from tests.envs import subprocess_env

_SEEN: list[Path] = []


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gives_its_agents_a_state_dir_of_its_own(run: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    # What a `powerfleet agent` spawned by a test (directly, or by `up`) reads for its node-local
    # lock and write-ahead state: never the machine's directory, and not the previous test's.
    state_dir = Path(load_config(environ=subprocess_env()).agent.state_dir)
    assert str(state_dir) != AgentConfig().state_dir, f"the machine's own state dir: {state_dir}"
    assert tmp_path_factory.getbasetemp() in state_dir.parents, state_dir
    assert state_dir not in _SEEN, (state_dir, _SEEN)
    _SEEN.append(state_dir)


def test_the_callers_own_settings_are_dropped_but_the_suites_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERFLEET_NODES", "[from-my-shell]")
    env = subprocess_env(POWERFLEET_BEAT__RECONCILE_INTERVAL_S="1")
    assert "POWERFLEET_NODES" not in env and env["POWERFLEET_BEAT__RECONCILE_INTERVAL_S"] == "1", env
    assert "POWERFLEET_AGENT__STATE_DIR" in env, sorted(k for k in env if k.startswith("POWERFLEET_"))
