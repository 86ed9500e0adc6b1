"""Batched evaluations (budget/batch.py) against the loopback API server and a real redis-server:
one snapshot for every deployment of the batch, then only writes, and none where nothing changed."""

from __future__ import annotations

from powerfleet.budget.batch import BatchState, SnapshotCluster, SnapshotScaling, SnapshotStatus, read_snapshot
from powerfleet.budget.program import DeploymentBudget
from powerfleet.budget.runner import evaluate_deployment
from powerfleet.clock import FakeClock
from powerfleet.cluster.budget_store import CONDITION_TYPE, KubeBudgetStore
from powerfleet.cluster.scaling import KubeScaling
from powerfleet.testing.budget.stand_in_operator import budget_status, dgd, replicas, settle

BUDGET = DeploymentBudget(power_limit_w=5000)
KEYS = ["default/llama", "default/alpha", "other/beta"]


def _calls(kube) -> list[tuple[str, str]]:
    """Count the API calls ``kube`` makes from here on: (method, path) each."""
    log: list[tuple[str, str]] = []
    request = kube.api_client.rest_client.request

    def counted(method, url, *a, **kw):
        log.append((method, url.split("?")[0].split("/", 3)[-1]))
        return request(method, url, *a, **kw)

    kube.api_client.rest_client.request = counted
    return log


def _batch(kube, state, clock, scaling):
    """As budget.evaluate_batch runs them: one snapshot of the cluster, the state read once."""
    snap = read_snapshot(kube, scaling, KEYS)
    view, sink, scale = SnapshotCluster(kube, snap), SnapshotStatus(KubeBudgetStore(kube), snap), \
        SnapshotScaling(scaling, snap)
    batch_state = BatchState(state, state._r)
    return {k: evaluate_deployment(view, batch_state, k, BUDGET, None, clock, sink, scale) for k in KEYS}


def test_a_batch_reads_once_and_then_only_writes_what_changed(world):
    api, kube, state = world
    api.apply(dgd("alpha", 1, 1))
    api.apply(dgd("beta", 1, 2, namespace="other"))
    settle(api, kube, "alpha", ["gpu-0"])
    settle(api, kube, "beta", ["gpu-0"], namespace="other")
    clock, scaling = FakeClock(t=1_800_000_000.0), KubeScaling(kube)
    kube.dgd_version()
    log = _calls(kube)
    first = _batch(kube, state, clock, scaling)
    reads = [c for c in log if c[0] == "GET"]
    # DGDs, status ConfigMaps, the DGD pods (one page), the adapters of each of the two namespaces
    assert len(reads) == 5, reads
    assert all(o.status_written and o.reason == "Planned" for o in first.values()), first
    assert budget_status(api, "beta", "other")["reason"] == "Planned"

    del log[:]
    clock.advance(30)
    again = _batch(kube, state, clock, scaling)
    assert len(log) == 5 and all(m == "GET" for m, _ in log), log  # nothing changed: the snapshot, no write
    assert not any(o.status_written or o.events or o.replicas_written for o in again.values()), again

    state.propose("default/alpha", {"decode": 3}, at=clock.now(), source="test")
    del log[:]
    scaled = _batch(kube, state, clock, scaling)
    writes = [c for c in log if c[0] != "GET"]
    assert scaled["default/alpha"].replicas_written == {"decode": 3}, scaled
    assert replicas(api, "alpha") == {"prefill": 1, "decode": 3}
    # alpha's replica write and its status ConfigMap (no event: a scale is recorded in the status)
    assert all("alpha" in path for _, path in writes), writes
    assert scaled["default/alpha"].events == [], scaled
    assert budget_status(api, "alpha")["lastScale"]["changes"] == ["decode replicas 1 -> 3 (decode)"]
    assert not any(o.status_written for k, o in scaled.items() if k != "default/alpha"), scaled
    # what the batch's state recorded is what a single evaluation reads back
    assert state.last_replicas("default/alpha") == {"Frontend": 1, "prefill": 1, "decode": 3}
    assert state.figures()["default/alpha"]["reason"] == "Planned" and not state.was_rolling("default/llama")


def test_a_deployment_missing_from_the_snapshot_is_not_found(world):
    _, kube, state = world
    scaling = KubeScaling(kube)
    snap = read_snapshot(kube, scaling, ["default/nosuch"])
    out = evaluate_deployment(SnapshotCluster(kube, snap), state, "default/nosuch", BUDGET, None,
                              FakeClock(t=1_800_000_000.0), SnapshotStatus(KubeBudgetStore(kube), snap),
                              SnapshotScaling(scaling, snap))
    assert out.reason == "NotFound", out


def _writes(log: list[tuple[str, str]], name: str) -> list[str]:
    """The writes for one deployment (its DGD, its status ConfigMap, its events) as 'METHOD what'."""
    out = []
    for method, path in log:
        if method == "GET" or name not in path and "events" not in path:
            continue
        what = "events" if "events" in path else "condition" if path.endswith("/status") else \
            "configmap" if "configmaps" in path else "dgd"
        out.append(f"{method} {what}")
    return sorted(out)


def test_a_scale_costs_its_replica_patch_and_its_status_and_a_transition_adds_its_own(world):
    # issue 30 item 4: at most 2 API calls per scale. Before, a scale also sent a Scaled event (and a
    # BudgetReasons event, or rewrote the DGD condition when a clamp reason appeared): 3 to 5 calls.
    # A clamp reason appearing is in the status only: no BudgetReasons event since.
    api, kube, state = world
    api.apply(dgd("alpha", 1, 1))
    settle(api, kube, "alpha", ["gpu-0"])
    clock, scaling = FakeClock(t=1_800_000_000.0), KubeScaling(kube)
    kube.dgd_version()
    _batch(kube, state, clock, scaling)  # the statuses and conditions written once
    log = _calls(kube)
    state.propose("default/alpha", {"decode": 3}, at=clock.now(), source="test")
    steady = _batch(kube, state, clock, scaling)["default/alpha"]
    assert steady.replicas_written == {"decode": 3} and steady.events == [], steady
    assert _writes(log, "alpha") == ["PATCH configmap", "PATCH dgd"], log
    settle(api, kube, "alpha", ["gpu-0"])
    clock.advance(30)
    _batch(kube, state, clock, scaling)
    del log[:]
    state.propose("default/alpha", {"decode": 20}, at=clock.now(), source="test")  # above its 5,000 W
    clamped = _batch(kube, state, clock, scaling)["default/alpha"]
    assert clamped.replicas_written == {"decode": 9} and clamped.events == [], clamped
    # the clamp is in the status (its reasons and its last scale), not in the condition: still 2 calls
    assert _writes(log, "alpha") == ["PATCH configmap", "PATCH dgd"], log
    status = budget_status(api, "alpha")
    assert status["reasons"] == ["power_budget_clamped"], status
    assert status["lastScale"] == {"at": status["lastScale"]["at"], "changes": ["decode replicas 3 -> 9 (decode)"]}
    condition = [c for c in api.get("nvidia.com/v1alpha1", "DynamoGraphDeployment", "alpha")["status"]["conditions"]
                 if c["type"] == CONDITION_TYPE]
    assert [(c["status"], c["reason"]) for c in condition] == [("True", "Planned")], condition
    assert "within its power budget" in condition[0]["message"], condition
