"""The `control_plane` tier: a real etcd + kube-apiserver (and on request scheduler, controller-manager
and kwok with fake GPU nodes), started once per test run from the binaries `make control-plane`
builds (powerfleet.testing.controlplane). Where they are not built, every test here skips with one
reason; `make test` builds them first where Go is there."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from powerfleet.testing.controlplane import ControlPlane, built_bin_dir
from powerfleet.testing.controlplane.crds import install_crds
from powerfleet.twin.apiserver import ApiServer
from tests.control_plane.cluster import FakeNodes
from tests.control_plane.servers import Server

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m "not control_plane"` deselects (make test without the binaries)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.control_plane)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver with envtest's flags and Dynamo's CRDs; stopped with nothing left running."""
    bin_dir = built_bin_dir()
    if bin_dir is None:
        pytest.skip("control plane not built (make control-plane; needs Go)")
    plane = ControlPlane(bin_dir, tmp_path_factory.mktemp("control-plane"))
    t0 = time.monotonic()
    plane.start()
    try:
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        install_crds(api)
        api.close()
        plane.start_seconds["ready with CRDs"] = time.monotonic() - t0
        yield plane
    finally:
        plane.stop()
        left = plane.running()
        assert left == [], f"control-plane programs still running after stop: {left}"


@pytest.fixture(scope="session")
def fake_nodes(control_plane: ControlPlane) -> FakeNodes:
    """kube-scheduler, kube-controller-manager and kwok, with four fake GPU nodes on two racks
    (8 GPUs each; `gpu-b-2` carries the GPU taint). Stopped with the control plane."""
    t0 = time.monotonic()
    control_plane.start_scheduler()
    control_plane.start_controller_manager()
    control_plane.start_kwok(control_plane.bin_dir.parent / "kwok-stages.yaml")
    nodes = FakeNodes.create(control_plane)
    control_plane.start_seconds["scheduler+controller-manager+kwok+nodes"] = time.monotonic() - t0
    return nodes


@pytest.fixture(scope="session")
def admin(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    """A fresh namespace per test (the real server keeps what a test wrote; tests never share one)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.fixture(params=["loopback", "real"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """The same test against the loopback server and against the real one (differential tests)."""
    if request.param == "real":
        yield Server("real", request.getfixturevalue("admin"), request.getfixturevalue("namespace"))
        return
    with ApiServer() as loop:
        api = config.new_client_from_config(config_file=str(loop.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            yield Server("loopback", api, "default", loop)
        finally:
            api.close()
