"""charts/powerfleet installed for real: `helm install --wait`, `helm upgrade` to production values
and `helm uninstall` (its pre-delete drain hook Job run to completion) against kube-apiserver with
the scheduler, the controller-manager and kwok's fake GPU nodes; every object accepted by the real
server, the DaemonSet's and Deployments' pods created and Ready on fake nodes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.control_plane.cluster import CHART, NODES, helm
from tests.waiting import wait_for

# Production: every component on that needs no CRD or storage class the test cluster lacks:
# cluster-wide RBAC, retune (leases, trace volume), rack budgets, Flower, a sweep pool, two workers,
# the dashboard ConfigMap, agents restricted to namespaces.
PRODUCTION: dict[str, Any] = {
    "rbac": {"watchAllNamespaces": True},
    "retune": {"enabled": True, "traceVolume": {"emptyDir": {}}},
    "budget": {"enabled": True},
    "config": {"nodes": sorted(NODES), "budget": {"groups": {"rack-a": 40000, "rack-b": 40000}}},
    "worker": {"replicas": 2},
    "sweepWorker": {"enabled": True, "replicas": 2},
    "flower": {"enabled": True, "basicAuthSecret": {"name": "flower-auth"}},
    "metrics": {"dashboard": {"enabled": True}},
    "agent": {"safeDefaultWatts": 450},  # + namespaces: the serving namespace the test creates
}


def _values(tmp: Path, values: dict[str, Any]) -> str:
    path = tmp / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _ok(done) -> str:  # type: ignore[no-untyped-def]
    assert done.returncode == 0, f"helm {done.args[2:5]} failed:\n{done.stderr[-3000:]}\n{done.stdout[-2000:]}"
    return done.stdout


def _ready_pods(core: client.CoreV1Api, ns: str) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(ns).items
            if p.status.phase == "Running" and any(c.type == "Ready" and c.status == "True"
                                                   for c in p.status.conditions or [])}


@pytest.mark.timeout(900)  # three helm --wait calls of up to 180 s each on a loaded machine
def test_helm_installs_upgrades_and_uninstalls_the_chart(control_plane, fake_nodes, admin, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ns, release = f"pf-{uuid.uuid4().hex[:6]}", "pf"
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    out = _ok(helm(control_plane, "install", release, str(CHART), "-n", ns, "--create-namespace", "--wait",
                   "--timeout", "180s"))
    assert "STATUS: deployed" in out, out
    daemonset = apps.read_namespaced_daemon_set(f"{release}-powerfleet-agent", ns)
    assert daemonset.status.number_ready == len(NODES), daemonset.status  # the GPU taint is tolerated
    ready = _ready_pods(core, ns)
    agents = sorted(node for name, node in ready.items() if "-agent-" in name)
    assert agents == sorted(NODES), ready
    for name in ("beat", "worker"):
        dep = apps.read_namespaced_deployment(f"{release}-powerfleet-{name}", ns)
        assert dep.status.ready_replicas == dep.spec.replicas, (name, dep.status)

    serving = f"{ns}-llm"  # the agents' pods to read live there (a Role each)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=serving)))
    production = {**PRODUCTION, "agent": {**PRODUCTION["agent"], "namespaces": [serving]}}
    core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name="flower-auth"),
                                                      string_data={"basic-auth": "[ops:s3cret]"}))
    _ok(helm(control_plane, "upgrade", release, str(CHART), "-n", ns, "-f", _values(tmp_path, production),
             "--wait", "--timeout", "180s"))
    for name, replicas in (("worker", 2), ("sweep-worker", 2), ("flower", 1)):
        dep = apps.read_namespaced_deployment(f"{release}-powerfleet-{name}", ns)
        assert dep.status.ready_replicas == replicas, (name, dep.status)
    roles = {r.metadata.name for r in client.RbacAuthorizationV1Api(admin).list_cluster_role().items}
    assert f"{ns}-{release}-powerfleet-worker" in roles, sorted(r for r in roles if release in r)
    status = json.loads(_ok(helm(control_plane, "status", release, "-n", ns, "-o", "json")))
    assert status["version"] == 2 and status["info"]["status"] == "deployed", status["info"]

    _ok(helm(control_plane, "uninstall", release, "-n", ns, "--wait", "--timeout", "180s"))
    hook_ran = [e for e in core.list_namespaced_event(ns).items
                if e.involved_object.kind == "Job" and e.reason == "Completed"]
    assert hook_ran, [(e.involved_object.kind, e.reason) for e in core.list_namespaced_event(ns).items]
    wait_for(lambda: not apps.list_namespaced_daemon_set(ns).items and not apps.list_namespaced_deployment(ns).items,
             "the release's workloads gone", timeout_s=60)
    assert _ok(helm(control_plane, "list", "-n", ns, "-q")).strip() == ""
