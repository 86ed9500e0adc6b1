"""MIG: the kubelet lists a MIG slice by its MIG UUID, the power limit is the parent GPU's. The
port lists each GPU's MIG devices (simulated driver, nvidia-ml-py's own exception classes), the
agent maps a slice's allocation to its parent, and pods on slices of one parent share its cap
like pods on a shared GPU (the lowest valid cap)."""

from __future__ import annotations

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.agent.nvml import NvmlBackend
from powerfleet.agent.podresources import Allocation, PodResourcesClient
from powerfleet.agent.simnvml import SimulatedNvml
from powerfleet.agent.simulated import SimulatedGpus, parse_devices, write_proc_entry
from powerfleet.twin.gpus.podresources import PodResourcesServers
from tests.agent.conftest import Bench, device

MIG0 = ["MIG-0000-a", "MIG-0000-b", "MIG-0000-c"]  # three slices of GPU 0; GPU 1 has no MIG


@pytest.fixture
def mig_bench(bench: Bench) -> Bench:
    bench.gpus = SimulatedGpus([device(0, mig=MIG0), device(1)])
    return bench


def test_the_port_lists_a_gpus_mig_devices_and_none_for_a_gpu_without_mig(mig_bench: Bench) -> None:
    g0, g1 = (mig_bench.gpus.read(i) for i in range(2))
    assert (g0.mig_uuids, g1.mig_uuids) == (tuple(MIG0), ())
    nvml = SimulatedNvml(mig_bench.gpus)
    parent = nvml.nvmlDeviceGetHandleByIndex(0)
    slot = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    assert nvml.nvmlDeviceIsMigDeviceHandle(slot) and not nvml.nvmlDeviceIsMigDeviceHandle(parent)
    assert nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(slot) == parent
    assert nvml.nvmlDeviceGetHandleByUUID("MIG-0000-b") == slot
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)  # an empty slot
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerManagementLimit(slot)  # the limit is the parent's
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(1))


def test_a_failing_mig_query_loses_the_slices_never_the_gpu(mig_bench: Bench) -> None:
    class Broken(SimulatedNvml):
        def nvmlDeviceGetMaxMigDeviceCount(self, h):  # noqa: N802 - pynvml's name
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    port = NvmlBackend(Broken(mig_bench.gpus))
    reading = port.read(0)
    assert reading.mig_uuids == () and reading.max_mw == 700_000


def test_mig_uuids_are_validated() -> None:
    with pytest.raises(ValueError, match="MIG device UUIDs start with 'MIG-'"):
        parse_devices([device(0, mig=["GPU-x"])])
    with pytest.raises(ValueError, match="unique across GPUs"):
        parse_devices([device(0, mig=["MIG-x"]), device(1, mig=["MIG-x"])])


def test_pods_on_slices_of_one_parent_cap_it_from_their_allocations_over_grpc(mig_bench: Bench) -> None:
    uid_a = mig_bench.pod("a", "300")
    uid_b = mig_bench.pod("b", "250")
    slices = {"a": [0], "b": []}
    served = [{"metadata": {"name": n, "namespace": "default"}, "spec": {"nodeName": "node-a"}} for n in ("a", "b")]
    servers = PodResourcesServers(["node-a"], lambda: served, lambda p: slices[p["metadata"]["name"]],
                                  lambda n, g: MIG0[g], mig_resource="nvidia.com/mig-1g.18gb").start()
    try:
        client = PodResourcesClient(str(servers.sockets["node-a"]))
        agent = mig_bench.agent()
        agent._allocations = client.list
        g0, g1 = agent.run_pass().gpus
        assert (g0.decision, g0.pods, g0.cap_w) == ("single", [uid_a], 300)  # idle slice: its parent capped
        assert (g1.decision, g1.cap_w) == ("idle", None) and mig_bench.limits() == [300, 700]

        slices["b"] = [1]  # b gets a second slice of the same parent
        assert client.list()["MIG-0000-b"] == [Allocation("default", "b", "main")]
        g0 = agent.run_pass().gpus[0]
        assert (g0.decision, sorted(g0.pods), g0.cap_w) == ("conflict", sorted([uid_a, uid_b]), 250)
        assert mig_bench.limits() == [250, 700]

        # a's process runs on its slice: NVML lists it on the parent; no mismatch with the allocations.
        write_proc_entry(mig_bench.proc, 301, uid_a)
        mig_bench.set_pids(0, [301])
        g0 = agent.run_pass().gpus[0]
        assert (g0.decision, g0.cap_w) == ("conflict", 250)
        assert mig_bench.metrics.value("powerfleet_agent_podresources_mismatch_total") == 0
    finally:
        servers.stop()


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.sampled_from(MIG0 + ["MIG-0001-a"]), st.sampled_from([220, 300, 450, 650]), max_size=4))
def test_a_parent_gets_the_lowest_cap_of_the_pods_on_its_slices(tmp_path_factory, slices: dict[str, int]) -> None:
    from tests.agent.conftest import host_process

    tmp = tmp_path_factory.mktemp("mig")
    host_process(tmp / "proc")
    b = Bench(tmp=tmp, gpus=SimulatedGpus([device(0, mig=MIG0), device(1, mig=["MIG-0001-a"])]))
    names = {mig: f"pod-{i}" for i, mig in enumerate(slices)}
    for mig, cap in slices.items():
        b.pod(names[mig], str(cap))
    agent = b.agent()
    agent._allocations = lambda: {mig: [Allocation("default", names[mig], "main")] for mig in slices}
    agent.run_pass()
    for gpu, migs in ((0, MIG0), (1, ["MIG-0001-a"])):
        caps = [cap for mig, cap in slices.items() if mig in migs]
        assert b.limits()[gpu] == (min(caps) if caps else 700)
