"""Start real control workers on the loopback server's kubeconfig with a group budget (the budget's
end-to-end tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.integration.conftest import wait_worker


def start_control(launcher: Any, app: Any, kubeconfig: Path, groups: Mapping[str, int],
                  deployments: Mapping[str, int], names: Sequence[str]) -> None:
    """``deployments``: "ns/name" -> its own power limit; one worker (concurrency 2) per name."""
    launcher.env.update({
        "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
        "POWERFLEET_BUDGET__GROUPS": json.dumps(dict(groups)),
        "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({k: {"power_limit_w": w} for k, w in deployments.items()}),
    })
    for name in names:
        launcher.spawn("worker", "worker", "--queues", "control", "--name", name, "--concurrency", "2")
    for name in names:
        wait_worker(app, name)
