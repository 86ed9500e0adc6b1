"""Retune on the real API server (issue 34 item 4): the DGD in the real CRD (v1alpha1, status through
its subresource), its frontend pods, the leadership and state Leases, all under the control
worker's ServiceAccount token and the chart's RBAC. A decision is saved by a resourceVersion-
fenced Lease update and written to every router (revision-checked PATCH to loopback frontends);
a stale leader is refused by the real server's 409 and by its term; a rollback restores the
routers' initial settings. Two leaders are two identities with their own injected clocks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from powerfleet.broker.embedded import EmbeddedRedis
from powerfleet.clock import FakeClock
from powerfleet.cluster.kube import KubeCluster
from powerfleet.cluster.ports import LeaseConflict
from powerfleet.cluster.router import TIMEOUT_S as PATCH_TIMEOUT_S
from powerfleet.retune import control, live
from powerfleet.retune.context import Deployment
from powerfleet.retune.leadership import STATE_ANNOTATION, Fenced, leader_lease_name, state_lease_name
from powerfleet.retune.live import actuate
from powerfleet.retune.state import RetuneState, parse_state
from powerfleet.testing.controlplane.objects import RealObjects
from powerfleet.testing.retune_world import BASE_K, START_POLICY, World, start_of, traffic_lines, write_segments
from tests.control_plane.cluster import admin_client
from tests.control_plane.fleet import FleetRbac
from tests.retune.conftest import make_ports, retune_config

T0 = 1_800_000_000.0
DECIDED = {"overlap_score_credit": 1.0, "overlap_score_credit_decay": 0.0, "prefill_load_scale": 4.0,
           "temperature": 0.0, "host_cache_hit_weight": 0.75, "disk_cache_hit_weight": 0.25,
           "shared_cache_multiplier": 0.0, "decode_active_request_weight": 0.0}


@pytest.fixture(scope="module")
def fleet(control_plane, tmp_path_factory) -> Iterator[FleetRbac]:  # type: ignore[no-untyped-def]
    rbac = FleetRbac.install(control_plane, tmp_path_factory.mktemp("retune-rbac"), values={"retune": {"enabled": True}})
    yield rbac
    rbac.close()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def world(fleet: FleetRbac, tmp_path: Path) -> Iterator[World]:
    """Objects written by the admin into the fleet's namespace; the retune reads them as the worker."""
    admin = admin_client(fleet.plane)
    (tmp_path / "traces").mkdir()
    w = World(RealObjects(admin, fleet.namespace), tmp_path / "traces", fleet.plane.kubeconfig)
    try:
        yield w
    finally:
        w.stop()
        admin.close()


@pytest.fixture
def kube(fleet: FleetRbac) -> KubeCluster:
    return KubeCluster(fleet.client("worker"))


def _setup(world: World, fleet: FleetRbac, kube: KubeCluster, redis_url: str,
           identity: str = "ctl-a", speed: float = 1.0) -> tuple[str, Any, Any, Any]:
    name = f"llama-{uuid.uuid4().hex[:6]}"  # the module's namespace is shared: Leases are named by the DGD
    fes = world.add_deployment(name)
    cfg = retune_config(world, [name], namespace=fleet.namespace)
    return name, fes, cfg, make_ports(redis_url, kube, identity, FakeClock(T0, speed))


def _decide(cfg: Any, ports: Any, name: str) -> RetuneState:
    """Save a decision as a harvest does: a fenced update of the state Lease under the current term."""
    dep = Deployment.open(cfg, ports, name)
    t, _, _ = dep.leadership.claim()
    assert t is not None, f"{ports.identity} is not the leader of {name}"
    return dep.store.update(t, lambda s: s.model_copy(update={"desired": dict(DECIDED), "desired_window": 1}))


def _stored_state(kube: KubeCluster, ns: str, name: str) -> RetuneState:
    state = parse_state(kube.get_lease(ns, state_lease_name(name)).annotations[STATE_ANNOTATION])
    assert state is not None, f"no state on the real server's Lease {state_lease_name(name)}"
    return state


def test_a_decision_is_saved_fenced_and_written_to_every_router_of_the_real_dgd(world, fleet, kube,
                                                                                redis_url) -> None:
    name, fes, cfg, ports = _setup(world, fleet, kube, redis_url)
    stored = kube.custom.get_namespaced_custom_object(
        "nvidia.com", "v1alpha1", fleet.namespace, "dynamographdeployments", name)
    assert sorted(stored["spec"]["services"]) == ["frontend", "worker"], stored  # the real CRD's form
    first = control.tick_deployment(cfg, ports, name, T0)
    assert (first["status"], first["term"]) == ("leader", 1), first
    lead = kube.get_lease(fleet.namespace, leader_lease_name(name))
    assert (lead.holder_identity, lead.lease_transitions) == ("ctl-a", 1), lead
    before = kube.get_lease(fleet.namespace, state_lease_name(name)).resource_version
    _decide(cfg, ports, name)
    after = kube.get_lease(fleet.namespace, state_lease_name(name))
    assert after.resource_version != before and _stored_state(kube, fleet.namespace, name).desired == DECIDED, after
    out = control.tick_deployment(cfg, ports, name, T0 + 10)
    assert sorted(r["pod"] for r in out["routers"]) == sorted(fes) and all(r["converged"] for r in out["routers"]), out
    assert all(fe.policy.model_dump() == DECIDED for fe in fes.values()), {p: fe.policy for p, fe in fes.items()}
    # The routers' initial settings were saved (fenced) before their first PATCH.
    state = _stored_state(kube, fleet.namespace, name)
    assert sorted(state.initial) == sorted(fes) and all(
        v["temperature"] == START_POLICY["temperature"] for v in state.initial.values()), state.initial


def test_a_stale_leader_is_refused_by_the_real_servers_409_and_its_term(world, fleet, kube, redis_url) -> None:
    name, fes, cfg, a = _setup(world, fleet, kube, redis_url, speed=100.0)
    b = make_ports(redis_url, kube, "ctl-b", FakeClock(T0, 5000.0))
    assert control.tick_deployment(cfg, a, name, T0)["term"] == 1
    _decide(cfg, a, name)
    assert all(r["converged"] for r in control.tick_deployment(cfg, a, name, T0)["routers"])
    # A pauses here, holding term 1, the state it read and the state Lease as it read it.
    dep_a = Deployment.open(cfg, a, name)
    term_a = dep_a.term_of("ctl-a", 1)
    state_a, _ = dep_a.store.read()
    lease_a = kube.get_lease(fleet.namespace, state_lease_name(name))

    assert control.tick_deployment(cfg, b, name, T0)["status"] == "standby"  # B's expiry timer starts
    b.clock.advance(cfg.lease_duration_s)
    took = control.tick_deployment(cfg, b, name, T0 + 30)
    assert (took["status"], took["term"]) == ("leader", 2), took
    assert _stored_state(kube, fleet.namespace, name).term == 2

    # A resumes. Its write at the version it read is refused by the real server (B wrote since) ...
    with pytest.raises(LeaseConflict):
        kube.update_lease(lease_a.model_copy(update={"annotations": {STATE_ANNOTATION: "{}"}}))
    # ... and every fenced path re-reads the leadership Lease and stops on the lost term, also with
    # a router to write (an operator changed one by hand).
    manual = fes[sorted(fes)[0]]
    manual.patch(b'{"revision": %d, "policy": {"temperature": 0.5}}' % manual.revision, "operator")
    writes = {p: len(fe.writes) for p, fe in fes.items()}
    with pytest.raises(Fenced):
        dep_a.store.update(term_a, lambda s: s.model_copy(update={"desired": None}))
    assert state_a is not None
    with pytest.raises(Fenced):
        actuate(dep_a, a, term_a, state_a)
    assert {p: len(fe.writes) for p, fe in fes.items()} == writes, "the stale leader PATCHed a router"
    assert _stored_state(kube, fleet.namespace, name).desired == DECIDED
    assert control.tick_deployment(cfg, a, name, T0 + 40)["status"] == "standby"
    again = control.tick_deployment(cfg, b, name, T0 + 40)  # the new leader reverts the manual change
    assert all(r["converged"] for r in again["routers"]) and manual.policy.temperature == 0.0, again
    assert manual.writes[-1].leader == "ctl-b", manual.writes[-1]


def test_a_rollback_restores_every_routers_initial_settings(world, fleet, kube, redis_url) -> None:
    name, fes, cfg, ports = _setup(world, fleet, kube, redis_url)
    control.tick_deployment(cfg, ports, name, T0)
    _decide(cfg, ports, name)
    control.tick_deployment(cfg, ports, name, T0)
    assert all(fe.policy.temperature == DECIDED["temperature"] for fe in fes.values())
    out = control.rollback(cfg, ports, name)
    assert out["status"] == "rolling-back" and all(r["converged"] for r in out["routers"]), out
    assert all(fe.policy.temperature == START_POLICY["temperature"] for fe in fes.values()), \
        {p: fe.policy for p, fe in fes.items()}
    assert _stored_state(kube, fleet.namespace, name).rollback == "intent"  # phase one, on the real Lease
    ports.clock.advance(PATCH_TIMEOUT_S)  # converged again after a late PATCH could have landed: done
    again = control.rollback(cfg, ports, name)
    assert again["status"] == "rolled-back", again
    state = _stored_state(kube, fleet.namespace, name)
    assert state.rollback == "done" and state.history[-1].outcome == "rollback", state


def test_a_window_on_the_real_dgd_passes_its_premises_and_an_unsettled_one_is_blocked(world, fleet, kube,
                                                                                      redis_url) -> None:
    """The premises read the real DGD (v1alpha1 spec and status) and its Running frontend pods."""
    name, fes, cfg, _ = _setup(world, fleet, kube, redis_url)
    clock = FakeClock(start_of(BASE_K) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    assert control.tick_deployment(cfg, ports, name, clock.now())["status"] == "leader"
    write_segments(world.trace_dir, name, sorted(fes), traffic_lines(240, start_of(BASE_K), 115.0))

    def launch(k: int) -> dict[str, Any]:
        clock.advance(start_of(k + 1) + 1 - clock.now())
        control.tick_deployment(cfg, ports, name, clock.now())
        (win,) = [w for w in ports.send.of(control.WINDOW_TASK) if w["window"] == k]
        return live.launch_window(cfg, ports, name, k, leader=win["leader"], term=win["term"],
                                  generation=win["generation"])

    out = launch(BASE_K + 1)
    assert out["status"] == "launched" and out["requests"] > 0, out
    assert ports.send.of(live.SHARD_TASK), "no shard sent for a launched window"
    # The operator has not yet observed a new generation: the next window waits.
    world.api.apply({"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
                     "metadata": {"name": name}, "spec": world.api.get(
                         "nvidia.com/v1alpha1", "DynamoGraphDeployment", name)["spec"] | {"backendFramework": "vllm"},
                     "status": {"observedGeneration": 1, "state": "pending"}})
    blocked = launch(BASE_K + 2)
    assert blocked["status"] == "blocked" and blocked["premises"] == ["dgd-unsettled"], blocked
