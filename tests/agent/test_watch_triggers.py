"""Pod watch events that trigger a pass: an annotated pod's Ready flip or container start, with
its GPU allocated through the kubelet's PodResources API (twin gRPC server), against the
loopback API server through the official client. The GPU is idle throughout: only the watch
pass can cap it (no tick, no local timer, no process poll in these runs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from powerfleet.agent.podcache import PodCache
from powerfleet.agent.podresources import PodResourcesClient
from powerfleet.agent.runtime import AgentRuntime
from powerfleet.agent.watcher import PodState, cap_relevant_change, change_reason
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.gpus.podresources import PodResourcesServers
from tests.agent.conftest import Bench
from tests.waiting import wait_for

STARTED_AT = "2026-12-01T10:00:00Z"


def kpod(*, ready: bool = False, started: bool = False, restarts: int = 0, cap: str | None = "300") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running",
                              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if started:
        status["containerStatuses"] = [{"name": "main", "image": "m", "imageID": "m", "ready": ready,
                                        "restartCount": restarts,
                                        "state": {"running": {"startedAt": STARTED_AT[:-3] + f"{restarts:02d}Z"}}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default",
                         "annotations": {} if cap is None else {POWER_ANNOTATION: cap}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "m"}]}, "status": status}


def passes(bench: Bench, trigger: str) -> float:
    return bench.metrics.value("powerfleet_agent_passes_total", {"trigger": trigger, "outcome": "ok"})


@pytest.fixture
def node(bench: Bench, tmp_path: Path) -> Iterator[tuple[ApiServer, list[dict[str, Any]], AgentRuntime]]:
    """An agent runtime on the loopback API (watch-backed view) and a PodResources server whose
    allocations the test controls (GPU 1 for every pod it lists)."""
    allocated: list[dict[str, Any]] = []
    servers = PodResourcesServers(["node-a"], lambda: list(allocated), lambda p: [1],
                                  lambda n, g: f"GPU-{g:04d}").start()
    with ApiServer() as api:
        api.apply(kpod())
        cluster = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        kicks: list[Any] = []
        cache = PodCache(cluster, "node-a", [], lambda reason: [k(reason) for k in kicks], watch_timeout_s=5)
        agent = bench.agent()
        agent._list_pods = cache.snapshot
        agent._allocations = PodResourcesClient(str(servers.sockets["node-a"])).list
        rt = AgentRuntime(agent, interval_s=3600, clock=bench.clock)  # no tick, timer or process poll
        kicks.append(rt.request_pass)
        rt.stoppers.append(cache.start().stop)
        rt.start()
        try:
            wait_for(lambda: passes(bench, "watch") >= 1, "the first listing's pass")
            yield api, allocated, rt
        finally:
            rt.stop()
            cluster.close()
            servers.stop()


@pytest.mark.parametrize(("change", "reason"), [
    (dict(ready=True, started=True), "pod default/p became ready"),
    (dict(ready=False, started=True), "pod default/p container started"),
])
def test_an_allocated_pod_turning_ready_or_starting_a_container_gets_a_pass_that_caps_its_idle_gpu(
        bench: Bench, node, change: dict[str, Any], reason: str) -> None:
    api, allocated, rt = node
    assert bench.limits() == [700, 700]  # listed before its allocation: nothing to cap yet
    allocated.append(kpod())  # the kubelet allocates GPU 1 when it admits and starts the pod
    api.apply(kpod(**change))
    wait_for(lambda: bench.limits() == [700, 300], "the watch pass to cap the allocated GPU")
    assert rt.last_watch_reason.startswith(reason)
    wait_for(lambda: passes(bench, "watch") >= 2, "the pass to be counted")  # counted after its last write
    assert passes(bench, "tick") == passes(bench, "timer") == passes(bench, "process") == 0


def test_a_container_restart_of_a_ready_pod_gets_a_pass(bench: Bench, node) -> None:
    api, allocated, rt = node
    before = passes(bench, "watch")
    api.apply(kpod(ready=True, started=True))
    # The reason is set when a pass starts; wait until the ready pass has also finished (it is
    # counted after its last write), or the allocation below could be seen by that pass.
    wait_for(lambda: passes(bench, "watch") > before, "the ready pass to finish")
    assert rt.last_watch_reason.startswith("pod default/p became ready")
    assert bench.limits() == [700, 700]  # nothing allocated yet: nothing to cap
    done = passes(bench, "watch")
    allocated.append(kpod())
    api.apply(kpod(ready=True, started=True, restarts=1))
    wait_for(lambda: passes(bench, "watch") > done, "the restart's pass to finish")
    assert bench.limits() == [700, 300]
    assert rt.last_watch_reason.startswith("pod default/p container started")


def state(ann: str | None = "300", ready: bool = False, started: tuple[str, ...] = ()) -> PodState:
    return PodState(ann, "Running", False, ready, started)


def test_ready_flips_and_container_starts_of_annotated_pods_only_are_cap_relevant() -> None:
    assert cap_relevant_change(state(), state(ready=True))
    assert change_reason(state(), state(ready=True)) == "became ready"
    assert change_reason(state(ready=True), state()) == "became unready"
    assert cap_relevant_change(state(), state(started=("main@t0",)))
    assert change_reason(state(started=("main@t0",)), state(started=("main@t1",))) == "container started"
    assert not cap_relevant_change(state(None), state(None, ready=True, started=("main@t0",)))
    assert not cap_relevant_change(state(ready=True), state(ready=True))


def test_the_agents_own_report_annotation_never_asks_for_a_pass() -> None:
    """The agent patches the report onto the pod, which the watch sees: no pass, no loop."""
    from powerfleet.agent.annotate import REPORT_ANNOTATION
    from powerfleet.agent.watcher import pod_state
    from powerfleet.cluster.objects import PodInfo

    before = PodInfo(name="p", namespace="d", uid="u", phase="Running", ready=True, annotations={POWER_ANNOTATION: "300"})
    after = before.model_copy(update={"annotations": {POWER_ANNOTATION: "300", REPORT_ANNOTATION: "{}"},
                                      "resource_version": "9"})
    assert not cap_relevant_change(pod_state(before), pod_state(after))


def test_the_twins_kubelet_reports_the_container_start_and_the_ready_flip_the_watch_acts_on(tmp_path: Path) -> None:
    from powerfleet.agent.watcher import pod_state
    from powerfleet.twin.cluster.kubelet import next_status

    with ApiServer() as api:
        p = kpod()
        p["status"] = {"phase": "Pending"}
        api.apply(p)
        cluster = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        states = []
        for now in (1000.0, 1001.0):
            stored = api.get("v1", "Pod", "p", "default")
            api.apply({**stored, "status": next_status(stored, now, startup_delay_s=0)})
            (info,) = cluster.list_pods("default", node_name="node-a")
            states.append(pod_state(info))
        cluster.close()
    started, ready = states
    assert (started.ready, started.started) == (False, ("main@1970-01-01T00:16:40+00:00",))  # running since t=1000
    assert ready.ready is True and ready.started == started.started  # the same start, now Ready
    assert change_reason(None, started) == "added" and change_reason(started, ready) == "became ready"
