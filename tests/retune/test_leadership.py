"""Lease leadership and fenced state against the loopback API server, with real frontends and Redis.

Two "processes" are two identities with their own clocks: expiry is measured on each one's
own monotonic clock, so time moves only when a test says so.
"""

from __future__ import annotations

from typing import Any

import pytest

from powerfleet.clock import FakeClock
from powerfleet.cluster.router import TIMEOUT_S as PATCH_TIMEOUT_S
from powerfleet.cluster.objects import Lease
from powerfleet.retune import control, harvest, live
from powerfleet.retune.fanin import SweepRecord
from powerfleet.retune.settings import resolve
from powerfleet.retune.context import Deployment
from powerfleet.retune.leadership import STATE_ANNOTATION, Fenced, leader_lease_name, state_lease_name
from powerfleet.retune.live import actuate
from powerfleet.retune.state import RetuneState, parse_state
from powerfleet.testing.retune_world import frontend_pod
from powerfleet.twin.serving.frontend import LoopbackFrontend
from tests.retune.conftest import make_ports, retune_config

T0 = 1_800_000_000.0
DECIDED = {"overlap_score_credit": 1.0, "overlap_score_credit_decay": 0.0, "prefill_load_scale": 4.0,
           "temperature": 0.0, "host_cache_hit_weight": 0.75, "disk_cache_hit_weight": 0.25,
           "shared_cache_multiplier": 0.0, "decode_active_request_weight": 0.0}


def _decide(cfg: Any, ports: Any, name: str = "llama") -> RetuneState:
    """Save a decision as a harvest would (fenced), under the current term."""
    dep = Deployment.open(cfg, ports, name)
    t, _, _ = dep.leadership.claim()
    assert t is not None
    return dep.store.update(t, lambda s: s.model_copy(update={"desired": dict(DECIDED), "desired_window": 1}))


def _applied(world: Any, kube: Any, redis_url: str) -> tuple[Any, Any, Any]:
    """A deployment whose routers were retuned by leader ctl-a: (frontends, config, ports)."""
    fes = world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    control.tick_deployment(cfg, ports, "llama", T0)
    _decide(cfg, ports)
    control.tick_deployment(cfg, ports, "llama", T0)
    assert all(fe.policy.temperature == 0.0 for fe in fes.values())
    return fes, cfg, ports


def test_handover_and_a_paused_stale_leader_is_fenced(world, kube, redis_url) -> None:
    fes = world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ca, cb = FakeClock(T0, 100.0), FakeClock(T0, 5000.0)
    a, b = make_ports(redis_url, kube, "ctl-a", ca), make_ports(redis_url, kube, "ctl-b", cb)

    first = control.tick_deployment(cfg, a, "llama", T0)
    assert (first["status"], first["term"]) == ("leader", 1)
    _decide(cfg, a)
    assert control.tick_deployment(cfg, a, "llama", T0)["routers"][0]["converged"]
    assert all(fe.policy.temperature == 0.0 for fe in fes.values())
    # A pauses here, holding term 1 and a state it read.
    dep_a = Deployment.open(cfg, a, "llama")
    term_a = dep_a.term_of("ctl-a", 1)
    state_a, _ = dep_a.store.read()

    assert control.tick_deployment(cfg, b, "llama", T0)["status"] == "standby"  # B's timer starts now
    cb.advance(cfg.lease_duration_s - 1)
    assert control.tick_deployment(cfg, b, "llama", T0)["status"] == "standby"  # not yet expired for B
    cb.advance(1)
    took = control.tick_deployment(cfg, b, "llama", T0 + 30)
    assert (took["status"], took["term"]) == ("leader", 2)
    assert parse_state(kube.get_lease("default", state_lease_name("llama")).annotations[STATE_ANNOTATION]).desired == DECIDED

    # An operator changes one router by hand; the stale leader resumes with its old term.
    pod = sorted(fes)[0]
    manual = fes[pod]
    manual.patch(b'{"revision": %d, "policy": {"temperature": 0.5}}' % manual.revision, "operator")
    writes_before = {p: len(fe.writes) for p, fe in fes.items()}
    with pytest.raises(Fenced):
        dep_a.store.update(term_a, lambda s: s.model_copy(update={"desired": None}))
    assert state_a is not None
    with pytest.raises(Fenced):
        actuate(dep_a, a, term_a, state_a)
    assert all(len(fe.writes) == writes_before[p] for p, fe in fes.items())  # not one PATCH from A
    assert not any(w.leader == "ctl-a" for fe in fes.values() for w in fe.writes[writes_before[pod]:])

    # The new leader reverts the manual change within one round.
    again = control.tick_deployment(cfg, b, "llama", T0 + 40)
    assert all(r["converged"] for r in again["routers"])
    assert manual.policy.temperature == 0.0 and manual.writes[-1].leader == "ctl-b"
    # A's own tick sees B's Lease and stays out.
    assert control.tick_deployment(cfg, a, "llama", T0 + 40)["status"] == "standby"


def test_a_corrupt_state_is_reported_and_replaced_on_the_next_claim(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    assert control.tick_deployment(cfg, ports, "llama", T0)["status"] == "leader"
    for bad in ('{"schema": "powerfleet.retune.state/v1", "term": 1, "updated": NaN}',
                '{"schema": "powerfleet.retune.state/v1", "term": true}', "not json", '{"schema": "x"}'):
        lease = kube.get_lease("default", state_lease_name("llama"))
        kube.update_lease(lease.model_copy(update={"annotations": {STATE_ANNOTATION: bad}}))
        out = control.tick_deployment(cfg, ports, "llama", T0)
        assert out["status"] == "leader" and out["corrupt_state_replaced"], bad
        text = kube.get_lease("default", state_lease_name("llama")).annotations[STATE_ANNOTATION]
        assert parse_state(text).term == out["term"]


def test_shutdown_releases_the_lease_and_a_peer_takes_it_at_once(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    a = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    b = make_ports(redis_url, kube, "ctl-b", FakeClock(T0, 1.0))
    assert control.tick_deployment(cfg, a, "llama", T0)["term"] == 1
    assert control.release_all(cfg, a) == ["llama"]
    assert kube.get_lease("default", leader_lease_name("llama")).holder_identity is None
    assert control.tick_deployment(cfg, b, "llama", T0)["term"] == 2


def test_rollback_restores_initials_and_never_calls_retuned_routers_converged(world, kube, redis_url) -> None:
    fes, cfg, ports = _applied(world, kube, redis_url)
    # Lose one frontend's saved initial settings, as after a SIGTERM between its PATCH and the save.
    dep = Deployment.open(cfg, ports, "llama")
    t, _, _ = dep.leadership.claim()
    lost = sorted(fes)[1]
    dep.store.update(t, lambda s: s.model_copy(update={"initial": {k: v for k, v in s.initial.items() if k != lost}}))
    out = control.rollback(cfg, ports, "llama")
    by_pod = {r["pod"]: r for r in out["routers"]}
    kept = sorted(fes)[0]
    assert by_pod[kept]["converged"] and fes[kept].policy.temperature == 1.0
    assert not by_pod[lost]["converged"] and "still on retuned values" in by_pod[lost]["error"]
    assert out["status"] == "rolling-back"
    assert dep.store.read()[0].rollback == "intent"  # phase one persisted; it stays until all converge


def test_disabling_retune_rolls_back_then_deletes_state_and_leases(world, kube, redis_url) -> None:
    fes, cfg, ports = _applied(world, kube, redis_url)
    off = retune_config(world, ["llama"], per_deployment={"llama": {"enabled": False}})
    out = control.tick(off, ports, T0 + 10)
    assert out[0]["status"] == "rolling-back" and all(r["converged"] for r in out[0]["routers"])  # verifying
    ports.clock.advance(PATCH_TIMEOUT_S)
    out = control.tick(off, ports, T0 + 20)
    assert out[0]["status"] == "cleaned"
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())
    for name in (leader_lease_name("llama"), state_lease_name("llama")):
        with pytest.raises(Exception, match="404"):
            kube.get_lease("default", name)


def test_switching_to_advisory_rolls_routers_back(world, kube, redis_url) -> None:
    fes, cfg, ports = _applied(world, kube, redis_url)
    adv = retune_config(world, ["llama"], mode="advisory")
    out = control.tick_deployment(adv, ports, "llama", T0 + 10)
    assert out["mode"] == "advisory" and all(r["converged"] for r in out["routers"])
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())
    dep = Deployment.open(adv, ports, "llama")
    assert dep.store.read()[0].rollback == "intent"  # converged once; verified after the PATCH timeout
    ports.clock.advance(PATCH_TIMEOUT_S)
    control.tick_deployment(adv, ports, "llama", T0 + 15)
    assert dep.store.read()[0].rollback == "done"
    writes = sum(len(fe.writes) for fe in fes.values())
    manual = fes[sorted(fes)[0]]
    manual.patch(b'{"revision": %d, "policy": {"temperature": 0.25}}' % manual.revision, "operator")
    control.tick_deployment(adv, ports, "llama", T0 + 20)
    assert manual.policy.temperature == 0.25  # advisory writes nothing
    assert sum(len(fe.writes) for fe in fes.values()) == writes + 1


def test_lease_writes_carry_the_resource_version(world, kube) -> None:
    made = kube.create_lease(Lease(name="x", namespace="default", holder_identity="a", lease_transitions=1))
    kube.update_lease(made.model_copy(update={"holder_identity": "b"}))
    with pytest.raises(Exception, match="409"):
        kube.update_lease(made.model_copy(update={"holder_identity": "c"}))


def test_work_from_a_superseded_generation_or_term_is_dropped(world, kube, redis_url) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    ports = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    t = control.tick_deployment(cfg, ports, "llama", T0)["term"]
    gen = resolve(cfg, "llama").generation

    def sweep(sid: str, term: int, generation: str) -> None:
        ports.fanin.register(SweepRecord(
            sid=sid, dgd="llama", window=5, term=term, identity="ctl-a", generation=generation, mode="active",
            launched_at=T0, deadline=T0 + 40, window_file=str(world.trace_dir / "none"), requests=1, replicas=4,
            current=dict(DECIDED), shards=[]))

    sweep("old-gen", t, "0123456789abcdef")
    assert harvest.harvest(cfg, ports, "old-gen")["status"] == "dropped"
    state = Deployment.open(cfg, ports, "llama").store.read()[0]
    (rec,) = [h for h in state.history if h.window == 5]  # the drop is an outcome of its own
    assert (rec.outcome, rec.failure_reason) == ("dropped", "configuration-change")
    # A harvest on a worker that is not the leader leaves the sweep to the leader's harvest.
    other = make_ports(redis_url, kube, "ctl-b", FakeClock(T0, 1.0))
    sweep("old-term", t - 1 if t > 1 else 99, gen)
    assert harvest.harvest(cfg, other, "old-term")["status"] == "not-leader"
    assert ports.fanin.sweep("old-term").status == "running"
    # A window step launched under another configuration is dropped before it does anything.
    out = live.launch_window(cfg, ports, "llama", 5, leader="ctl-a", term=t, generation="0123456789abcdef")
    assert out["status"] == "dropped" and not ports.send.sent


def test_a_frontend_that_appears_later_gets_its_initials_saved_before_its_first_patch(world, kube, redis_url) -> None:
    fes, cfg, ports = _applied(world, kube, redis_url)
    late = LoopbackFrontend({"temperature": 0.25}).start()
    world.frontends["llama"]["llama-frontend-9"] = late
    world.api.apply(frontend_pod("llama", "llama-frontend-9", late.url))
    out = control.tick_deployment(cfg, ports, "llama", T0 + 10)
    assert all(r["converged"] for r in out["routers"]) and late.policy.temperature == 0.0
    state = Deployment.open(cfg, ports, "llama").store.read()[0]
    assert state.initial["llama-frontend-9"]["temperature"] == 0.25
    standby = make_ports(redis_url, kube, "ctl-b", FakeClock(T0, 1.0))
    assert control.promote(cfg, standby, "llama")["status"] == "not-leader"
    assert control.rollback(cfg, ports, "llama")["status"] == "rolling-back"  # converged, verifying
    assert late.policy.temperature == 0.25
    ports.clock.advance(PATCH_TIMEOUT_S)
    assert control.rollback(cfg, ports, "llama")["status"] == "rolled-back"


def test_a_leadership_lease_deleted_by_hand_continues_above_the_saved_term(world, kube, redis_url) -> None:
    fes, cfg, ports = _applied(world, kube, redis_url)
    b = make_ports(redis_url, kube, "ctl-b", FakeClock(T0, 1.0))
    control.release_all(cfg, ports)
    assert control.tick_deployment(cfg, b, "llama", T0)["term"] == 2
    kube.delete_lease("default", leader_lease_name("llama"))
    out = control.tick_deployment(cfg, ports, "llama", T0 + 10)
    assert (out["status"], out["term"]) == ("leader", 3)
    assert Deployment.open(cfg, ports, "llama").store.read()[0].term == 3


def test_a_superseded_term_of_the_same_identity_is_fenced(world, kube, redis_url) -> None:
    # The holder check alone passes a restarted leader's old term: same identity, later term.
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    dep = Deployment.open(cfg, make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0)), "llama")
    old, _, _ = dep.leadership.claim()
    assert old is not None and old.term == 1
    assert dep.leadership.release()
    new, _, acquired = dep.leadership.claim()
    assert new is not None and acquired and (new.identity, new.term) == (old.identity, 2)
    dep.leadership.check(new)
    with pytest.raises(Fenced, match="term 1 of ctl-a is superseded"):
        dep.leadership.check(old)
    with pytest.raises(Fenced):
        dep.store.update(old, lambda s: s.model_copy(update={"desired": dict(DECIDED), "desired_window": 1}))


class _Racing:
    """The real Lease port, with another writer's real update landing on the state Lease
    just before each of this store's next ``races`` updates (a real 409 follows)."""

    def __init__(self, kube: Any, races: int, lose_term: Any = None) -> None:
        self.kube, self.races, self.lose_term = kube, races, lose_term

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)

    def update_lease(self, lease: Lease) -> Lease:
        if self.races and lease.name == state_lease_name("llama"):
            self.races -= 1
            now = self.kube.get_lease(lease.namespace, lease.name)
            other = {**now.annotations, "other": str(int(now.annotations.get("other", "0")) + 1)}  # never a no-op
            self.kube.update_lease(now.model_copy(update={"annotations": other}))
            if self.lose_term is not None:
                self.lose_term()
        return self.kube.update_lease(lease)


def test_a_resource_version_conflict_on_the_state_rereads_and_retries_while_the_term_holds(world, kube,
                                                                                           redis_url) -> None:
    """Issue 37 finding 2: one conflict is a write that came first, not a lost term."""
    from powerfleet.retune.leadership import STATE_ATTEMPTS, Leadership, StateStore

    world.add_deployment("llama")
    clock = FakeClock(T0, 1.0)
    lead = Leadership(kube, "default", "llama", "ctl-a", duration_s=30, clock=clock)
    t, _, _ = lead.claim()
    assert t is not None
    StateStore(kube, lead).update(t, lambda s: s, replace_corrupt=True)
    change = lambda s: s.model_copy(update={"desired": dict(DECIDED), "desired_window": 1})  # noqa: E731
    for races in (1, STATE_ATTEMPTS - 1):
        racing = _Racing(kube, races)
        saved = StateStore(racing, Leadership(racing, "default", "llama", "ctl-a", duration_s=30,
                                              clock=clock)).update(t, change)
        assert saved.desired == DECIDED and racing.races == 0, (races, saved)
        got = parse_state(kube.get_lease("default", state_lease_name("llama")).annotations[STATE_ANNOTATION])
        assert got is not None and got.desired == DECIDED and got.desired_window == 1, got
    with pytest.raises(Fenced, match="tries in a row"):  # a Lease that never stops changing: bounded
        StateStore(_Racing(kube, STATE_ATTEMPTS), lead).update(t, change)
    # A conflict that came with a new term is the term's loss: the retry is fenced, never written.
    def hand_over() -> None:
        lease = kube.get_lease("default", leader_lease_name("llama"))
        kube.update_lease(lease.model_copy(update={"holder_identity": "ctl-b", "lease_transitions": t.term + 1}))

    racing = _Racing(kube, 1, lose_term=hand_over)
    before = kube.get_lease("default", state_lease_name("llama")).annotations[STATE_ANNOTATION]
    with pytest.raises(Fenced, match="superseded"):
        StateStore(racing, Leadership(racing, "default", "llama", "ctl-a", duration_s=30, clock=clock)).update(
            t, lambda s: s.model_copy(update={"desired_window": 7}))
    assert kube.get_lease("default", state_lease_name("llama")).annotations[STATE_ANNOTATION] == before
