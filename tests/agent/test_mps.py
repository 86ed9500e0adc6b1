"""Issue 32: GPUs shared through MPS, and GPUs whose processes have an unknown owner.

The NVIDIA device plugin's MPS sharing runs ``nvidia-cuda-mps-server`` in its MPS
control-daemon pod (no power annotation); the clients are the workload pods, listed by
``nvmlDeviceGetMPSComputeRunningProcesses`` and allocated the GPU's shared replicas
(``GPU-…::N``) by the kubelet. Everything runs through the real NVML port over the simulated
driver, which raises pynvml's own exception classes (``NOT_SUPPORTED`` where a driver cannot
list MPS clients).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.agent.attribution import is_mps_server
from powerfleet.agent.nvml import NvmlBackend
from powerfleet.agent.podresources import api_pb2, gpu_allocations
from powerfleet.agent.reconcile import NodeAgent
from powerfleet.agent.simnvml import SimulatedNvml
from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from tests.agent.conftest import Bench, device

SERVER = 900  # nvidia-cuda-mps-server
DAEMON = "nvidia-device-plugin-mps-control-daemon-x7k2p"


def allocations(*pods: tuple[str, list[str]]) -> dict[str, Any]:
    """The kubelet's PodResources List answer: MPS replicas are ``GPU-…::N`` device IDs."""
    resp = api_pb2.ListPodResourcesResponse()
    for name, ids in pods:
        c = resp.pod_resources.add(name=name, namespace="default").containers.add(name="main")
        c.devices.add(resource_name="nvidia.com/gpu", device_ids=ids)
    return gpu_allocations(resp)


def agent(bench: Bench, alloc: dict[str, Any] | None = None) -> NodeAgent:
    return NodeAgent("node-a", open_gpus=bench.open_gpus, list_pods=bench.list_pods, proc_root=bench.proc,
                     state=bench.state, clock=bench.clock, safe_default_watts=bench.safe_default,
                     metrics=bench.metrics, allocations=(lambda: alloc or {}) if alloc is not None else None)


def mps_server(bench: Bench, *, in_pod: bool = True) -> None:
    """The MPS server: in the device plugin's daemon pod (no annotation), or a host service."""
    uid = bench.pod(DAEMON, None) if in_pod else None
    write_proc_entry(bench.proc, SERVER, uid, program="/usr/bin/nvidia-cuda-mps-server")


def share(bench: Bench, clients: list[int] | None, index: int = 0) -> None:
    """GPU ``index`` runs the server and ``clients`` (None: the driver cannot list MPS clients)."""
    def change(devs: list[Any]) -> None:
        devs[index].pids = [SERVER]
        devs[index].mps_pids = clients
    bench.gpus.update(change)


def test_the_mps_client_list_comes_through_the_nvml_port_apart_from_the_server() -> None:
    gpus = SimulatedGpus([device(0, pids=[SERVER], mps_pids=[11, 12]), device(1, pids=[5], mps_pids=None)])
    port = NvmlBackend(SimulatedNvml(gpus))
    r0, r1 = port.read(0), port.read(1)
    assert (r0.pids, r0.mps_pids) == ((11, 12, SERVER), (11, 12)), r0
    assert (r1.pids, r1.mps_pids) == ((5,), None), r1  # NOT_SUPPORTED: clients not known from NVML
    with pytest.raises(pynvml.NVMLError) as err:
        SimulatedNvml(gpus).nvmlDeviceGetMPSComputeRunningProcesses(port._handle(1))
    assert err.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_an_mps_servers_clients_decide_the_cap_not_the_daemon_pod_without_an_annotation(bench: Bench) -> None:
    """Old code: the daemon pod counted as a pod without a value, so the safe default (500 W
    here) capped two clients that agree on 600 W."""
    mps_server(bench)
    a = bench.pod("decode-0", "600", pids=(11,))
    b = bench.pod("decode-1", "600", pids=(12,))
    share(bench, [11, 12])
    g0 = agent(bench).run_pass().gpus[0]
    assert (g0.decision, sorted(g0.pods), g0.cap_w) == ("agree", sorted([a, b]), 600), g0
    assert "MPS server" in g0.reason and bench.limits()[0] == 600, g0


def test_clients_the_driver_cannot_list_are_taken_from_the_kubelets_allocation(bench: Bench) -> None:
    mps_server(bench)
    a = bench.pod("decode-0", "600")
    share(bench, None)  # an older driver: NOT_SUPPORTED for the MPS client list
    g0 = agent(bench, allocations(("decode-0", ["GPU-0000::0"]))).run_pass().gpus[0]
    assert (g0.decision, g0.pods, g0.cap_w, g0.unattributed) == ("single", [a], 600, 0), g0
    assert bench.limits()[0] == 600, g0


def test_an_mps_server_whose_clients_cannot_be_known_takes_the_safe_default(bench: Bench) -> None:
    """Old code: released (the daemon pod has no annotation), so unknown clients ran uncapped."""
    mps_server(bench)
    share(bench, None)
    g0 = agent(bench, allocations()).run_pass().gpus[0]
    assert (g0.decision, g0.cap_w, g0.unattributed) == ("safe_default", 500, 1), g0
    assert bench.limits()[0] == 500, g0
    # Beside an opted-in pod the same uncertainty keeps the current cap, lowered only by a valid value.
    bench.pod("decode-0", "450", pids=(11,))
    share(bench, None)
    bench.gpus.update(lambda devs: devs[0].pids.append(11))
    g0 = agent(bench).run_pass().gpus[0]
    assert (g0.decision, g0.cap_w) == ("conflict", 450), g0


def test_a_host_mps_server_left_without_clients_lets_the_cap_go_with_its_pod(bench: Bench) -> None:
    """Old code: the host server was an unattributed process, so the 300 W cap of a pod long gone
    stayed on the GPU for as long as the server lingered."""
    mps_server(bench, in_pod=False)
    bench.pod("decode-0", "300", pids=(11,))
    share(bench, [11])
    node = agent(bench)
    assert node.run_pass().gpus[0].cap_w == 300 and bench.limits()[0] == 300
    bench.pods.clear()
    share(bench, [])  # the client exited; the driver lists no MPS client
    g0 = node.run_pass().gpus[0]
    assert (g0.decision, g0.unattributed) == ("release", 0) and bench.limits()[0] == 700, g0
    assert node.managed == set()


def test_a_gpu_with_a_host_process_and_no_opted_in_pod_takes_the_safe_default(bench: Bench) -> None:
    """Finding 3's rule: only a GPU with no opted-in pod and an unknown owner takes the safe default.
    Old code kept whatever limit it had (hold): 700 W."""
    write_proc_entry(bench.proc, 77, None, program="/opt/someone/train")
    bench.set_pids(0, [77])
    node = agent(bench)
    g0 = node.run_pass().gpus[0]
    assert (g0.decision, g0.cap_w, g0.unattributed) == ("safe_default", 500, 1) and bench.limits()[0] == 500, g0
    assert node.managed == {"GPU-0000"}
    bench.set_pids(0, [])  # it exits: the safe default goes with it
    g0 = node.run_pass().gpus[0]
    assert g0.decision == "release" and bench.limits()[0] == 700 and node.managed == set(), g0


def test_an_unknown_owner_leaves_a_gpu_it_does_not_manage_that_is_already_below_the_safe_default(bench: Bench) -> None:
    bench.gpus = SimulatedGpus([device(0, current_w=300, pids=[77])])  # an operator's own nvidia-smi -pl 300
    write_proc_entry(bench.proc, 77, None)
    node = agent(bench)
    g0 = node.run_pass().gpus[0]
    assert (g0.decision, g0.action) == ("hold", "none") and bench.limits()[0] == 300 and node.managed == set(), g0


def test_a_pod_seen_leaving_a_namespace_scoped_view_is_gone_not_unknown(bench: Bench) -> None:
    """With ``agent.namespaces`` a pod absent from the view may be in another namespace (an
    unknown owner), unless this agent saw it leave: then its lingering process counts for nobody."""
    bench.pod("train-0", None, pids=(11,))
    bench.set_pids(0, [11])
    node = agent(bench)
    node.complete_view = False
    assert node.run_pass().gpus[0].decision == "release"
    bench.pods.clear()  # deleted; the process has not exited yet
    g0 = node.run_pass().gpus[0]
    assert (g0.decision, g0.unattributed, bench.limits()[0]) == ("idle", 0, 700), g0
    fresh = agent(bench)  # a new agent never saw it: unknown
    fresh.complete_view = False
    assert fresh.run_pass().gpus[0].decision == "safe_default"


def test_a_blind_proc_root_holds_every_cap_rather_than_taking_the_safe_default(bench: Bench) -> None:
    bench.set_pids(0, [4242])  # NVML sees it; the proc root (another PID namespace) does not
    report = agent(bench).run_pass()
    assert report.blind and report.gpus[0].decision == "hold" and bench.limits()[0] == 700, report


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_cmdline_is_read_without_raising_and_only_the_server_names_itself(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "7").mkdir()
        (Path(tmp) / "7" / "cmdline").write_bytes(raw)
        got = is_mps_server(tmp, 7)
    argv0 = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    assert got == (argv0.rsplit("/", 1)[-1] == "nvidia-cuda-mps-server"), (raw, got)


def test_a_cmdline_that_is_not_a_regular_file_is_no_server(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    os.mkfifo(tmp_path / "7" / "cmdline")  # never blocks the pass
    assert not is_mps_server(tmp_path, 7) and not is_mps_server(tmp_path, 8)
