"""Issue 32: sets and readbacks by UUID reuse the handle this session's read took, and a handle
that fails (GPU_IS_LOST, NOT_FOUND) or outlives a re-init is resolved again. Through the real
NVML port over the simulated driver (pynvml's own exception classes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from powerfleet.agent.nvml import NvmlBackend
from powerfleet.agent.simnvml import SimulatedNvml
from powerfleet.agent.simulated import SimulatedGpus
from powerfleet.cluster.dgd import POWER_ANNOTATION
from tests.agent.conftest import Bench, device


class Counting:
    """The binding, with every call counted by name."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)

        def call(*args: Any) -> Any:
            self.calls[name] += 1
            return fn(*args)
        return call


def counted(bench: Bench) -> tuple[NvmlBackend, Counting]:
    nvml = Counting(SimulatedNvml(bench.gpus))
    port = NvmlBackend(nvml)
    bench.open_gpus = lambda: port  # type: ignore[method-assign]
    return port, nvml


def test_a_pass_sets_and_reads_back_through_the_handle_its_read_took(bench: Bench) -> None:
    port, nvml = counted(bench)
    bench.pod("p", "300", pids=(101,))
    bench.set_pids(0, [101])
    agent = bench.agent()
    first = agent.run_pass().gpus[0]
    assert (first.action, bench.limits()[0]) == ("set", 300), first
    bench.pods[0].annotations[POWER_ANNOTATION] = "350"
    nvml.calls.clear()
    again = agent.run_pass().gpus[0]
    assert (again.action, again.readback, bench.limits()[0]) == ("set", "match", 350), again
    assert nvml.calls["nvmlDeviceGetHandleByUUID"] == 0, nvml.calls  # was one per set, readback and enforced read
    assert nvml.calls["nvmlDeviceGetIndex"] == 3, nvml.calls  # each still checked against the index read


def test_a_handle_that_fails_is_dropped_and_the_uuid_resolved_again() -> None:
    gpus = SimulatedGpus([device(0), device(1)])
    nvml = Counting(SimulatedNvml(gpus))
    port = NvmlBackend(nvml)
    r = port.read(0)
    gpus.fail(0, "gpu_lost")  # NVML_ERROR_GPU_IS_LOST through the cached handle
    try:
        port.set_limit(0, 300_000, uuid=r.uuid)
    except Exception as exc:
        assert getattr(exc, "kind", None) == "gpu_lost", exc
    else:
        raise AssertionError("a set on a lost GPU succeeded")
    gpus.fail(0)  # it comes back
    nvml.calls.clear()
    port.set_limit(0, 300_000, uuid=r.uuid)
    assert nvml.calls["nvmlDeviceGetHandleByUUID"] == 1 and port.read_limit(0, uuid=r.uuid) == 300_000, nvml.calls


def test_a_device_gone_from_the_bus_is_lost_through_its_old_handle_and_not_found_by_uuid() -> None:
    gpus = SimulatedGpus([device(0), device(1)])
    port = NvmlBackend(SimulatedNvml(gpus))
    r1 = port.read(1)
    gpus.update(lambda devs: devs.pop())  # GPU 1 falls off the bus
    for expected in ("gpu_lost", "nvml"):  # the cached handle: GPU_IS_LOST; then by UUID: NOT_FOUND
        try:
            port.set_limit(1, 300_000, uuid=r1.uuid)
        except Exception as exc:
            assert getattr(exc, "kind", None) == expected and (expected != "nvml" or "NotFound" in str(exc)), exc
        else:
            raise AssertionError("a set on a GPU gone from the bus succeeded")


def test_a_reinit_drops_every_handle(bench: Bench) -> None:
    port, nvml = counted(bench)
    r = port.read(0)
    bench.gpus.fail(0, "uninitialized")  # a driver reload: the next call re-initialises NVML and retries
    nvml.calls.clear()
    port.set_limit(0, 300_000, uuid=r.uuid)
    assert (nvml.calls["nvmlInit"], nvml.calls["nvmlDeviceGetHandleByUUID"], port.reinits) == (1, 1, 1), nvml.calls
    assert bench.limits()[0] == 300
