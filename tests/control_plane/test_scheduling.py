"""The real kube-scheduler placing GPU pods on kwok's fake nodes (rack selectors, required affinity,
the GPU taint, nvidia.com/gpu capacity; Pending where nothing fits), and the budget's tick ledger
computed from those real pods checked against an independent count at every step."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kubernetes import client

from powerfleet.budget.state import BudgetState
from powerfleet.budget.tick import tick_limits
from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION
from powerfleet.cluster.gpu_pods import KubeGpuPods
from powerfleet.cluster.kube import KubeCluster
from powerfleet.config.fleet import DeploymentBudgetConfig
from powerfleet.testing.controlplane import GPU, RACK_LABEL
from tests.control_plane.cluster import NODES, admin_client
from tests.control_plane.servers import GROUP, PLURAL
from tests.integration.conftest import broker_url, redis_server  # noqa: F401 -- fixtures used here
from tests.waiting import wait_for

TOLERATE_GPU = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]


def in_racks(*racks: str) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": RACK_LABEL, "operator": "In", "values": list(racks)}]}]}}}


@pytest.fixture
def ns(fake_nodes, admin) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"sched-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)  # the controller-manager's namespace controller deletes its pods, kwok removes them
    wait_for(lambda: not core.list_namespaced_pod(name).items, f"namespace {name}'s pods gone (their GPUs free)",
             timeout_s=90)


def gpu_pod(core: client.CoreV1Api, ns: str, name: str, gpus: int, *, cap: int | None = None,
            dgd: tuple[str, str] | None = None, **spec: Any) -> None:
    labels = {LABEL_DGD_NAME: dgd[0], LABEL_COMPONENT: dgd[1]} if dgd else {"app": name}
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {POWER_ANNOTATION: str(cap)} if cap is not None else {}},
            "spec": {"containers": [{"name": "main", "image": "engine",
                                     "resources": {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}}}],
                     **spec}}
    core.create_namespaced_pod(ns, body)


def settled(core: client.CoreV1Api, ns: str) -> dict[str, str | None]:
    """pod -> its node, or None when the scheduler said Unschedulable; {} until every pod is one or the other."""
    out: dict[str, str | None] = {}
    for p in core.list_namespaced_pod(ns).items:
        if p.metadata.deletion_timestamp:
            continue
        unschedulable = any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                            for c in (p.status.conditions or []))
        if not p.spec.node_name and not unschedulable:
            return {}
        out[p.metadata.name] = p.spec.node_name
    return out


def unschedulable_message(core: client.CoreV1Api, ns: str, name: str) -> str:
    p = core.read_namespaced_pod(name, ns)
    return " ".join(c.message or "" for c in (p.status.conditions or []) if c.type == "PodScheduled")


def test_the_scheduler_honours_rack_selectors_the_gpu_taint_and_gpu_capacity(admin, ns: str) -> None:  # type: ignore[no-untyped-def]
    core = client.CoreV1Api(admin)
    for i in range(3):  # 3 x 4 GPUs on rack-b without the toleration: gpu-b-1 has 8, gpu-b-2 is tainted
        gpu_pod(core, ns, f"b-{i}", 4, node_selector={RACK_LABEL: "rack-b"})
    gpu_pod(core, ns, "tolerant", 8, node_selector={RACK_LABEL: "rack-b"}, tolerations=TOLERATE_GPU)
    gpu_pod(core, ns, "affine", 2, affinity=in_racks("rack-a"))
    gpu_pod(core, ns, "too-big", 9)
    placed = wait_for(lambda: settled(core, ns), "every pod scheduled or Unschedulable", timeout_s=60)
    on_b1 = sorted(n for n, node in placed.items() if node == "gpu-b-1")
    pending = sorted(n for n, node in placed.items() if node is None)
    assert len(on_b1) == 2 and set(on_b1) < {"b-0", "b-1", "b-2"}, placed
    assert placed["tolerant"] == "gpu-b-2" and placed["affine"] in ("gpu-a-1", "gpu-a-2"), placed
    assert pending == sorted({"b-0", "b-1", "b-2"} - set(on_b1) | {"too-big"}), placed
    why = unschedulable_message(core, ns, "too-big")
    assert "Insufficient nvidia.com/gpu" in why, why
    why = unschedulable_message(core, ns, pending[0])
    assert "untolerated taint" in why and "Insufficient nvidia.com/gpu" in why, why


def test_pods_on_kwok_nodes_become_running_and_ready(admin, ns: str) -> None:  # type: ignore[no-untyped-def]
    core = client.CoreV1Api(admin)
    gpu_pod(core, ns, "runner", 1, node_selector={RACK_LABEL: "rack-a"})
    wait_for(lambda: core.read_namespaced_pod("runner", ns).status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in core.read_namespaced_pod("runner", ns).status.conditions or []),
        "kwok runs the pod", timeout_s=60)


def _independent_ledger(core: client.CoreV1Api, ns: str, racks: list[str]) -> dict[str, int]:
    """Watts per rack from the real pods alone: a placed pod's cap x GPUs on its node's rack; a
    Pending one on every rack its nodeSelector admits."""
    node_rack = {n: r for n, (r, _) in NODES.items()}
    out = dict.fromkeys(racks, 0)
    for p in core.list_namespaced_pod(ns).items:
        if p.metadata.deletion_timestamp:
            continue
        watts = int(p.metadata.annotations[POWER_ANNOTATION]) * int(p.spec.containers[0].resources.limits[GPU])
        where = [node_rack[p.spec.node_name]] if p.spec.node_name else \
            [r for r in racks if (p.spec.node_selector or {}).get(RACK_LABEL, r) == r]
        for r in where:
            out[r] += watts
    return out


class _PodsOf:
    """The ledger's pod reader narrowed to one namespace: other tests' pods share the fake nodes."""

    def __init__(self, kube: KubeCluster, ns: str) -> None:
        self.reader, self.ns = KubeGpuPods(kube), ns

    def list_gpu_pods(self):  # type: ignore[no-untyped-def]
        return [p for p in self.reader.list_gpu_pods() if p.namespace == self.ns]


def test_the_budget_ledger_on_real_scheduled_pods_matches_an_independent_count(admin, ns: str, broker_url: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    custom.create_namespaced_custom_object(GROUP, "v1alpha1", ns, PLURAL, {
        "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": "llm"},
        "spec": {"services": {"decode": {"componentType": "worker", "replicas": 3, "resources": {"limits": {"gpu": "4"}},
                                         "extraPodMetadata": {"annotations": {POWER_ANNOTATION: "500"}}}}}})

    def replica(i: int) -> None:  # the operator's part: a replica's pod, rack-b only; the scheduler places it
        gpu_pod(core, ns, f"llm-decode-{i}", 4, cap=500, dgd=("llm", "decode"), node_selector={RACK_LABEL: "rack-b"})

    for i in range(3):
        replica(i)
    racks = ["rack-a", "rack-b"]
    cfg = {f"{ns}/llm": DeploymentBudgetConfig(power_limit_w=40_000)}
    state = BudgetState(redis.Redis.from_url(broker_url))
    kube = KubeCluster(admin)

    def step() -> dict[str, str | None]:
        placed = wait_for(lambda: settled(core, ns), "pods scheduled or Unschedulable", timeout_s=60)
        plan = tick_limits(kube, state, cfg, {"rack-a": 20_000, "rack-b": 20_000}, RACK_LABEL, _PodsOf(kube, ns),
                           now=100.0)
        expected = _independent_ledger(core, ns, racks)
        assert plan.group_current == expected, (plan.group_current, expected, placed)
        return placed

    placed = step()  # two fit on gpu-b-1 (gpu-b-2 is tainted), one Pending: 3 x 4 GPUs x 500 W on rack-b
    assert sorted(placed.values(), key=str) == sorted(["gpu-b-1", "gpu-b-1", None], key=str), placed
    assert _independent_ledger(core, ns, racks) == {"rack-a": 0, "rack-b": 6000}
    waiting = next(n for n, node in placed.items() if node is None)
    victim = next(n for n, node in placed.items() if node == "gpu-b-1")
    core.delete_namespaced_pod(victim, ns, grace_period_seconds=0)
    wait_for(lambda: core.read_namespaced_pod(waiting, ns).spec.node_name == "gpu-b-1",
             "the scheduler places the waiting pod on the freed GPUs", timeout_s=60)
    replica(3)  # the operator replaces the deleted replica: nothing fits it now
    placed = step()
    assert placed[waiting] == "gpu-b-1" and placed["llm-decode-3"] is None, placed
