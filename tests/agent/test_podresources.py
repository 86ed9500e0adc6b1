"""GPU identity from the kubelet's PodResources API: the twin serves it over gRPC on a unix
socket from its allocations, the agent reads it and caps an idle allocated GPU."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.agent.podresources import Allocation, PodResourcesClient, api_pb2, gpu_allocations
from powerfleet.agent.simulated import write_proc_entry
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.twin.gpus.podresources import PodResourcesServers
from tests.agent.conftest import Bench


def pod(name: str, cap: str | None, gpus: list[int], node: str = "node-a") -> dict:
    return {"metadata": {"name": name, "namespace": "default",
                         "annotations": {"gpus": ",".join(map(str, gpus)), **({POWER_ANNOTATION: cap} if cap else {})}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}, {"name": "sidecar"}]}}


def gpus_of(p: dict) -> list[int]:
    return [int(x) for x in p["metadata"]["annotations"]["gpus"].split(",") if x]


def test_an_idle_gpu_allocated_to_an_annotated_pod_is_capped_before_its_first_kernel(bench: Bench) -> None:
    uid_a = bench.pod("a", "300")
    bench.pod("b", "450", pids=(202,))
    served = [pod("a", "300", [1]), pod("b", "450", [0]), pod("elsewhere", "200", [0], node="node-b")]
    servers = PodResourcesServers(["node-a"], lambda: served, gpus_of, lambda n, g: f"GPU-{g:04d}").start()
    try:
        client = PodResourcesClient(str(servers.sockets["node-a"]))
        assert client.list() == {"GPU-0001": [Allocation("default", "a", "main")],
                                 "GPU-0000": [Allocation("default", "b", "main")]}
        bench.set_pids(0, [202])
        agent = bench.agent()
        agent._allocations = client.list
        g0, g1 = agent.run_pass().gpus
        assert (g1.decision, g1.pods, g1.cap_w) == ("single", [uid_a], 300)  # no process on it yet
        assert (g0.decision, g0.cap_w) == ("single", 450)
        assert bench.limits() == [450, 300]
        # A process of another pod on a's GPU (the allocation says a): counted, and the lower cap wins.
        write_proc_entry(bench.proc, 203, bench.pods[1].uid)
        bench.set_pids(1, [203])
        g1 = agent.run_pass().gpus[1]
        assert (g1.decision, g1.cap_w) == ("conflict", 300)
        assert bench.metrics.value("powerfleet_agent_podresources_mismatch_total") == 1
    finally:
        servers.stop()


def test_without_the_socket_the_agent_maps_by_process_only(bench: Bench, caplog) -> None:
    bench.pod("a", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent._allocations = PodResourcesClient("/nonexistent/kubelet.sock").list
    with caplog.at_level("WARNING", logger="powerfleet.agent"):
        agent.run_pass()
        report = agent.run_pass()
    assert report.good and bench.limits() == [300, 700]
    assert sum("mapping by process only" in m for m in caplog.messages) == 1


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu", "nvidia.com/gpu.shared"]),
                          st.lists(st.one_of(st.text(max_size=20), st.sampled_from(["GPU-a", "GPU-a::1", "MIG-b"])),
                                   max_size=3)), max_size=4))
def test_allocations_take_gpu_and_mig_uuids_of_the_gpu_resources(devices) -> None:
    resp = api_pb2.ListPodResourcesResponse()
    c = resp.pod_resources.add(name="p", namespace="ns").containers.add(name="main")
    for name, ids in devices:
        c.devices.add(resource_name=name, device_ids=ids)
    got = gpu_allocations(resp)
    expected = {i.split("::", 1)[0] for name, ids in devices if name in ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb")
                for i in ids if i.split("::", 1)[0]}  # every ID form: the agent maps or refuses it
    assert set(got) == expected and all(a == [Allocation("ns", "p", "main")] for a in got.values())


def test_a_time_sliced_device_id_names_its_gpu_and_every_pod_sharing_it() -> None:
    resp = api_pb2.ListPodResourcesResponse()
    for pod, replica in (("p", 3), ("q", 4), ("p", 3)):
        resp.pod_resources.add(name=pod, namespace="ns").containers.add(name="m").devices.add(
            resource_name="nvidia.com/gpu", device_ids=[f"GPU-abc::{replica}"])
    assert gpu_allocations(resp) == {"GPU-abc": [Allocation("ns", "p", "m"), Allocation("ns", "q", "m")]}


def test_the_twin_serves_each_nodes_allocations_with_its_gpu_uuids(tmp_path) -> None:
    from powerfleet.twin.cluster.operator import pod_gpus
    from powerfleet.twin.runtime import Twin, TwinOptions
    from powerfleet.twin.cluster.topology import TwinSpec
    from tests.waiting import wait_for

    twin = Twin(TwinOptions(spec=TwinSpec(nodes=1), root=tmp_path / "twin", window_s=10)).start()
    try:
        node = next(iter(twin.nodes))
        assert twin.manifest()["podresources_socket"].endswith("{node}.sock")
        client = PodResourcesClient(twin.manifest()["podresources_socket"].replace("{node}", node))
        placed = wait_for(lambda: [p for p in twin.api.list("v1", "Pod", twin.spec.namespace)
                                   if p["spec"].get("nodeName") == node and pod_gpus(p)], "pods placed on the node", 60)
        uuids = {d.index: d.uuid for d in twin.nodes[node].backend.devices()}
        got = wait_for(lambda: client.list() or None, "allocations", 30)
        for p in placed:
            for g in pod_gpus(p):
                assert got[uuids[g]] == [Allocation(p["metadata"]["namespace"], p["metadata"]["name"],
                                                    p["spec"]["containers"][0]["name"])]
    finally:
        twin.stop()
