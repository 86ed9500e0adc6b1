"""Issue 32 item 1: allocations are first-class. The kubelet's PodResources answers are built in
its own protobuf shapes (api_pb2) and read by the agent's own parser; the GPUs are the
simulated driver behind the real NVML port."""

from __future__ import annotations

import logging

from powerfleet.agent.podresources import api_pb2, gpu_allocations
from tests.agent.conftest import Bench


def kubelet(*entries: tuple[str, str, list[str]]):
    """A PodResources List answer: (pod, resource, device IDs) per container, as a kubelet sends it."""
    resp = api_pb2.ListPodResourcesResponse()
    for pod, resource, ids in entries:
        c = resp.pod_resources.add(name=pod, namespace="default").containers.add(name="main")
        c.devices.add(resource_name=resource, device_ids=ids)
    return lambda: gpu_allocations(resp)


def finished(bench: Bench, name: str, phase: str = "Succeeded") -> None:
    bench.pods = [p.model_copy(update={"phase": phase}) if p.name == name else p for p in bench.pods]


def test_an_idle_gpu_capped_from_its_allocation_keeps_its_cap_across_a_restart_without_a_pod_view(
        bench: Bench) -> None:
    """Finding 1: orphan recovery ran before any pod view and uncapped every idle managed GPU."""
    bench.pod("a", "300")
    allocations = kubelet(("a", "nvidia.com/gpu", ["GPU-0001"]))
    first = bench.agent()
    first._allocations = allocations
    assert first.run_pass().gpus[1].cap_w == 300 and bench.limits() == [700, 300]
    bench.list_error = RuntimeError("apiserver down")  # the restarted agent has no pod view yet
    second = bench.agent()
    second._allocations = allocations
    second.start()
    report = second.run_pass()
    assert report.skipped and bench.limits() == [700, 300], report
    bench.list_error = None
    report = second.run_pass()
    assert report.gpus[1].cap_w == 300 and bench.limits() == [700, 300], report.gpus[1]
    assert second.managed == {"GPU-0001"}


def test_an_idle_managed_gpu_whose_pod_is_gone_is_released_within_one_pass(bench: Bench) -> None:
    bench.pod("a", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    agent.run_pass()
    bench.set_pids(0, [])
    assert agent.run_pass().gpus[0].decision == "idle" and bench.limits()[0] == 300  # a worker may come back
    bench.pods.clear()  # the pod is deleted
    g0 = agent.run_pass().gpus[0]
    assert (g0.decision, g0.action) == ("release", "set") and bench.limits()[0] == 700, g0
    assert agent.managed == set()


def test_a_finished_pods_allocation_never_caps_the_gpus_next_tenant(bench: Bench) -> None:
    """Finding 2: PodResources keeps listing a Succeeded pod's device (kubernetes#119423)."""
    bench.pod("job", "250")
    finished(bench, "job")
    bench.pod("serve", "600")
    bench.pod("plain", None)
    agent = bench.agent()
    agent._allocations = kubelet(("job", "nvidia.com/gpu", ["GPU-0000"]), ("serve", "nvidia.com/gpu", ["GPU-0000"]),
                                 ("job", "nvidia.com/gpu", ["GPU-0001"]), ("plain", "nvidia.com/gpu", ["GPU-0001"]))
    g0, g1 = agent.run_pass().gpus
    assert (g0.decision, g0.cap_w) == ("single", 600), g0
    assert (g1.decision, g1.cap_w) == ("release", None), g1  # an unannotated tenant: not capped at all
    assert bench.limits() == [600, 700]


def test_a_managed_gpu_whose_only_pod_failed_is_released(bench: Bench) -> None:
    bench.pod("job", "250")
    agent = bench.agent()
    agent._allocations = kubelet(("job", "nvidia.com/gpu", ["GPU-0000"]))
    agent.run_pass()
    assert bench.limits()[0] == 250
    finished(bench, "job", "Failed")
    g0 = agent.run_pass().gpus[0]
    assert bench.limits()[0] == 700 and g0.decision == "release", g0


def test_index_device_ids_are_mapped_to_uuids_and_unknown_ones_refused_once(bench: Bench, caplog) -> None:
    """Finding 8: deviceIDStrategy=index IDs were dropped silently."""
    uid = bench.pod("a", "300")
    bench.pod("b", "450")
    agent = bench.agent()
    agent._allocations = kubelet(("a", "nvidia.com/gpu", ["1"]), ("b", "nvidia.com/gpu", ["gpu-zero"]))
    with caplog.at_level(logging.ERROR, logger="powerfleet.agent"):
        first, second = agent.run_pass(), agent.run_pass()
    assert (first.gpus[1].pods, first.gpus[1].cap_w) == ([uid], 300), first.gpus[1]
    assert bench.limits() == [700, 300] and second.good
    assert sum("'gpu-zero'" in m for m in caplog.messages) == 1, caplog.messages
    assert bench.metrics.value("powerfleet_agent_podresources_refused_ids_total") == 2
