"""Real parts: a real redis-server and real `powerfleet worker/agent/beat/flower` processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import redis

from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.config import load_config
from powerfleet.testing.waiting import wait_worker  # noqa: F401 - the tests import it from here
from powerfleet.workers.app import FleetCelery, create_app
from powerfleet.workers.launcher import Launcher
from tests.envs import subprocess_env
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def broker_url(redis_server: EmbeddedRedis) -> str:
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
def fleet_env(broker_url: str) -> dict[str, str]:
    """Environment every spawned process and the test's own app share."""
    return {"POWERFLEET_BROKER__URL": broker_url, "POWERFLEET_NODES": "[a, b]"}


@pytest.fixture
def launcher(tmp_path: Path, fleet_env: dict[str, str]) -> Iterator[Launcher]:
    with Launcher(log_dir=tmp_path / "logs", env=dict(fleet_env)) as fleet:
        yield fleet


@pytest.fixture
def app(fleet_env: dict[str, str]) -> FleetCelery:
    return create_app(load_config(environ=fleet_env))


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    full_env = subprocess_env()
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "powerfleet.cli", *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
