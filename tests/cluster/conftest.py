from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(api: ApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[KubeCluster]:
    cluster = KubeCluster.from_kubeconfig(str(kubeconfig))
    yield cluster
    cluster.close()
