"""Start real control workers on the loopback server's kubeconfig with a group budget (the budget's
end-to-end tests), and the two-deployment rack the generation tests share."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from powerfleet.testing.budget.stand_in_operator import dgd, replicas, settle
from tests.budget.conftest import RACK_A_NODES
from tests.integration.conftest import wait_worker

# The generation tests' rack: rack-a has 4,000 W; every replica is 1 GPU x 500 W; alpha and beta
# each start at (1 prefill, 1 decode), 2,000 W in all.
RACK_LIMIT_W, REPLICA_W, PAIR = 4000, 500, ("alpha", "beta")


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


def start_pair_on_rack(rack_a: Any, launcher: Any, app: Any, workers: Sequence[str]) -> None:
    """alpha and beta settled on rack-a (``rack_a`` fixture), and one control worker per name in
    ``workers``: two, so a newer tick runs while an older one's batch is held at the server."""
    api, kube, kubeconfig = rack_a
    for name in PAIR:
        api.apply(dgd(name, 1, 1))
        settle(api, kube, name, RACK_A_NODES)
    start_control(launcher, app, kubeconfig, {"rack-a": RACK_LIMIT_W}, {f"default/{n}": 8000 for n in PAIR}, workers)


def rack_w(api: Any) -> int:
    """rack-a's watts at the DGDs' replica counts (every replica of both lands on rack-a)."""
    return sum(n * REPLICA_W for name in PAIR for n in replicas(api, name).values())


def call(app: Any, task: str, **kwargs: Any) -> Any:
    return app.send_task(f"powerfleet.budget.{task}", kwargs=kwargs).get(timeout=90)


def batch_results(app: Any, tick: Mapping[str, Any]) -> dict[str, dict]:
    """Each deployment's evaluation (the tick sends them in batches, each under one task id)."""
    return {k: app.AsyncResult(t).get(timeout=90)["results"][k] for k, t in tick["task_ids"].items()}
