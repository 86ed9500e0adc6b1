"""The edges of issue 20 item 7: a corrupt state's rollback, a deleted or recreated DGD,
promote's refusals, bounded state, shutdown of a deployment removed from the config.
Real Redis, the loopback API server and loopback frontends; FakeClocks."""

from __future__ import annotations

import json

import pytest

from powerfleet.clock import FakeClock
from powerfleet.cluster.router import TIMEOUT_S as PATCH_TIMEOUT_S
from powerfleet.retune import control
from powerfleet.retune.context import Deployment
from powerfleet.retune.leadership import STATE_ANNOTATION, leader_lease_name, state_lease_name
from powerfleet.retune.state import DecisionRecord, dump_state
from powerfleet.twin.serving.frontend import LoopbackFrontend
from tests.retune.conftest import make_ports, retune_config
from tests.retune.test_leadership import DECIDED, T0, _applied
from powerfleet.testing.retune_world import dgd_object, frontend_pod

DGD_API = ("nvidia.com/v1alpha1", "DynamoGraphDeployment")


def _gone(kube, name: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        kube.get_lease("default", name)
    except Exception as exc:  # the official client's 404
        return "404" in str(exc) or "Not Found" in str(exc)
    return False


def test_a_corrupt_states_rollback_still_restores_every_router(world, kube, redis_url) -> None:
    fes, cfg, ports = _applied(world, kube, redis_url)
    lease = kube.get_lease("default", state_lease_name("llama"))
    ann = dict(lease.annotations)
    ann[STATE_ANNOTATION] = '{"schema": "powerfleet.retune.state/v1", "term": NaN'  # the state only
    kube.update_lease(lease.model_copy(update={"annotations": ann}))
    assert control.tick_deployment(cfg, ports, "llama", T0 + 5)["corrupt_state_replaced"]
    out = control.rollback(cfg, ports, "llama")
    assert all(r["converged"] for r in out["routers"])
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())  # back on their initial settings
    ports.clock.advance(PATCH_TIMEOUT_S)
    assert control.rollback(cfg, ports, "llama")["status"] == "rolled-back"
    assert "RetuneRolledBack" in {e.reason for e in kube.list_events("default", involved_name="llama")}


def test_a_deleted_dgd_ends_its_retune_and_does_not_loop(world, kube, redis_url) -> None:
    _, cfg, ports = _applied(world, kube, redis_url)
    world.api.delete(*DGD_API, "llama")
    out = control.tick_deployment(cfg, ports, "llama", T0 + 5)
    assert out["status"] == "dgd-missing" and "does not exist" in out["reason"]
    assert _gone(kube, leader_lease_name("llama")) and _gone(kube, state_lease_name("llama"))
    again = control.tick_deployment(cfg, ports, "llama", T0 + 15)
    assert again["status"] == "dgd-missing" and _gone(kube, leader_lease_name("llama"))  # nothing claimed


def test_a_dgd_recreated_under_the_same_name_starts_afresh(world, kube, redis_url) -> None:
    _, cfg, ports = _applied(world, kube, redis_url)
    old = Deployment.open(cfg, ports, "llama").store.read()[0]
    assert old.desired is not None and old.dgd_uid
    world.api.delete(*DGD_API, "llama")
    world.api.apply(dgd_object("llama"))  # a new object: a new uid, before any tick saw the gap
    control.tick_deployment(cfg, ports, "llama", T0 + 5)
    new = Deployment.open(cfg, ports, "llama").store.read()[0]
    assert new.dgd_uid and new.dgd_uid != old.dgd_uid and new.desired is None and new.history == []


def test_promote_refuses_a_superseded_or_old_recommendation(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"], mode="advisory", window_interval_s=60)
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    control.tick_deployment(cfg, ports, "llama", T0)
    dep = Deployment.open(cfg, ports, "llama")
    t, _, _ = dep.leadership.claim()
    k = int(T0 // 60) - 1  # the newest closed window

    def rec(window: int, outcome: str) -> DecisionRecord:
        return DecisionRecord(window=window, outcome=outcome, mode="advisory", params=dict(DECIDED),  # type: ignore[arg-type]
                              reason="r", term=t.term, generation="g", at=T0)

    dep.store.update(t, lambda s: s.model_copy(update={"advisory": rec(k - 1, "advisory"),
                                                       "history": [rec(k - 1, "advisory"), rec(k, "keep")]}))
    out = control.promote(cfg, ports, "llama")
    assert out["status"] == "refused" and f"window {k} decided to keep" in out["reason"]
    dep.store.update(t, lambda s: s.model_copy(update={"advisory": rec(k - 10, "advisory"), "history": [],
                                                       "last_launched": k}))
    out = control.promote(cfg, ports, "llama")
    assert out["status"] == "refused" and "10 windows old" in out["reason"]
    dep.store.update(t, lambda s: s.model_copy(update={"advisory": rec(k - 1, "advisory")}))
    assert control.promote(cfg, ports, "llama")["status"] == "promoted"


def test_initial_settings_of_vanished_pods_are_pruned_and_the_state_stays_small(world, kube, redis_url) -> None:
    fes, cfg, ports = _applied(world, kube, redis_url)
    pods = sorted(fes)
    spare = LoopbackFrontend({"temperature": 1.0}).start()
    world.frontends["llama"]["spare"] = spare
    sizes = []
    for i in range(15):  # 15 rollouts of a third frontend pod, each under a new name, fresh settings
        if i:
            world.api.delete("v1", "Pod", f"llama-frontend-r{i - 1}")
        spare.patch(b'{"revision": %d, "policy": {"temperature": 1.0, "prefill_load_scale": 1.0}}' % spare.revision)
        world.api.apply(frontend_pod("llama", f"llama-frontend-r{i}", spare.url))
        control.tick_deployment(cfg, ports, "llama", T0 + i)
        st = Deployment.open(cfg, ports, "llama").store.read()[0]
        sizes.append(len(dump_state(st)))
    assert sorted(st.initial) == sorted([*pods, "llama-frontend-r14"])
    assert max(sizes) - sizes[1] < 64 and max(sizes) < 16 * 1024  # bounded, far below the 256 KiB limit


def test_shutdown_releases_the_lease_of_a_deployment_removed_from_the_config(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    world.add_deployment("gone")
    both = retune_config(world, ["llama", "gone"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    ports.r.flushdb()
    control.tick(both, ports, T0)
    only = retune_config(world, ["llama"])
    assert sorted(control.release_all(only, ports)) == ["gone", "llama"]
    for name in ("llama", "gone"):
        assert kube.get_lease("default", leader_lease_name(name)).holder_identity is None


@pytest.mark.parametrize("text", ['{"fe": {"temperature": NaN}}', "[]", "not json", '{"fe": {"temperature": 1}}'])
def test_an_unreadable_initial_backup_is_ignored(world, kube, redis_url, text: str) -> None:
    from powerfleet.retune.leadership import INITIAL_ANNOTATION, StateStore

    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    control.tick_deployment(cfg, ports, "llama", T0)
    lease = kube.get_lease("default", state_lease_name("llama"))
    lease = lease.model_copy(update={"annotations": {**lease.annotations, INITIAL_ANNOTATION: text}})
    assert StateStore._saved_initial(lease) == {}
    assert json.loads(kube.get_lease("default", state_lease_name("llama")).annotations[INITIAL_ANNOTATION])


def test_the_applied_values_are_a_metric(world, kube, redis_url) -> None:
    from prometheus_client import REGISTRY

    _applied(world, kube, redis_url)
    got = {p: REGISTRY.get_sample_value("powerfleet_retune_applied_value", {"deployment": "llama", "parameter": p})
           for p in ("temperature", "prefill_load_scale")}
    assert got == {"temperature": DECIDED["temperature"], "prefill_load_scale": DECIDED["prefill_load_scale"]}
