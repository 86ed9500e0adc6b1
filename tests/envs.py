"""The environment a test gives a `powerfleet` process it spawns."""

from __future__ import annotations

import os

# Set by the suite itself (tests/conftest.py), not by whoever runs it: kept in every child's env.
SUITE_OWN = ("POWERFLEET_AGENT__STATE_DIR",)


def subprocess_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without the caller's own ``POWERFLEET_*`` settings (a developer's shell must not
    change what a test runs), keeping the suite's own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERFLEET_") or k in SUITE_OWN}
    env.update(extra)
    return env
