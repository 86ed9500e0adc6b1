"""``budget.pod_source: watch`` end to end: a real control worker keeps the ledger's pods by a
WATCH of the loopback API server (cluster/gpu_pod_cache.py), and its ticks charge a tenant that
arrives after the view was listed and stop charging it once it is gone, as a tick's own LIST
would (tests/budget/test_twin_ledger.py runs the same world with the default LIST)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from powerfleet.budget.state import BudgetState
from powerfleet.cluster.dgd import GPU_RESOURCE, POWER_ANNOTATION
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.cluster.manifests import AGG, DISAGG, dgd_manifests
from powerfleet.twin.cluster.tenants import tenant_pods
from powerfleet.twin.cluster.topology import GPU_MAX_W, RACK_LABEL, TwinSpec, node_objects
from tests.integration.conftest import wait_worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration
SPEC = TwinSpec(nodes=2)  # rack-a: twin-gpu-00, rack-b: twin-gpu-01


def _late_tenant(node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "late-tenant", "namespace": SPEC.namespace, "annotations": {POWER_ANNOTATION: "350"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "example.com/late:1",
                                                       "resources": {"limits": {GPU_RESOURCE: "2"}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_watching_control_worker_charges_a_tenant_that_arrives_and_stops_when_it_goes(
        tmp_path: Path, launcher, app, broker_url) -> None:
    with ApiServer() as api:
        for obj in node_objects(SPEC) + tenant_pods(SPEC) + dgd_manifests(SPEC):
            api.apply(obj)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        requests: list[str] = []
        served_before = api.faults.before
        api.faults.before = lambda method, path: (requests.append(f"{method} {path}"), served_before(method, path))[1]
        launcher.env.update({
            "POWERFLEET_BUDGET__KUBECONFIG": str(kubeconfig),
            "POWERFLEET_BUDGET__POD_SOURCE": "watch",
            "POWERFLEET_BUDGET__GROUP_LABEL": RACK_LABEL,
            "POWERFLEET_BUDGET__GROUPS": json.dumps({"rack-a": 60_000, "rack-b": 60_000}),
            "POWERFLEET_BUDGET__MAX_SETTABLE_GPU_W": str(GPU_MAX_W),
            "POWERFLEET_BUDGET__DEPLOYMENTS": json.dumps({f"default/{d}": {"power_limit_w": 100_000}
                                                          for d in (DISAGG, AGG)}),
        })
        launcher.spawn("worker", "worker", "--queues", "control", "--name", "ctl@watched", "--concurrency", "1")
        wait_worker(app, "ctl@watched")
        state = BudgetState(redis.Redis.from_url(broker_url))

        def tick_unmanaged() -> float:
            tick = app.send_task("powerfleet.budget.tick").get(timeout=60)
            assert not tick.get("skipped"), tick
            return state.group_history()[-1]["groups"]["rack-a"]["projected_w"]

        before = tick_unmanaged()  # the view is listed on the first tick (it waits for its LIST)
        api.apply(_late_tenant(SPEC.racks["rack-a"][0]))
        seen: list[float] = []

        def charged(expected: float) -> bool:
            seen.append(tick_unmanaged())
            return seen[-1] == expected

        wait_for(lambda: charged(before + 2 * 350), lambda: f"a tick to charge the late tenant's 2 x 350 W: {seen}")
        api.delete("v1", "Pod", "late-tenant", SPEC.namespace)
        wait_for(lambda: charged(before), lambda: f"a tick to stop charging it: {seen}")
        pod_reads = [r for r in requests if r.startswith("GET /api/v1/pods")]
        lists, watches = [r for r in pod_reads if "watch=" not in r], [r for r in pod_reads if "watch=" in r]
        # every tick and every batch's snapshot read the worker's view: one LIST in all, then its watch
        assert len(lists) == 1 and watches, pod_reads
        assert len(seen) >= 2
