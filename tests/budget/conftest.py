"""The integration fixtures (real redis-server, launcher, app) for the budget end-to-end test, and
``world``: a loopback API server (it serves ConfigMaps, where the budget keeps its status), one settled DGD "llama" (1 prefill, 1 decode)
on gpu-0, and the budget state in a real Redis."""

from pathlib import Path

import pytest
import redis

from powerfleet.budget.state import BudgetState
from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from powerfleet.testing.budget.stand_in_operator import dgd, settle
from tests.integration.conftest import app, broker_url, fleet_env, launcher, redis_server  # noqa: F401


@pytest.fixture
def world(tmp_path: Path, broker_url: str):  # noqa: F811 - the imported fixture, used here
    with ApiServer() as api:
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kc")))
        api.apply(dgd("llama", 1, 1))
        settle(api, kube, "llama", ["gpu-0"])
        yield api, kube, BudgetState(redis.Redis.from_url(broker_url))
        kube.close()


RACK_A_NODES = ["gpu-a1", "gpu-a2"]


@pytest.fixture
def rack_a(tmp_path: Path):
    """A loopback API server with two nodes in rack-a, and its kubeconfig."""
    with ApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        kube = KubeCluster.from_kubeconfig(str(kubeconfig))
        for n in RACK_A_NODES:
            api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"powerfleet.io/rack": "rack-a"}}})
        yield api, kube, kubeconfig
        kube.close()
