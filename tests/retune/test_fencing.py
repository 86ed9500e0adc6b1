"""A stale leader paused after its term check cannot leave a router on settings no decision chose.

Leader A checks its term and stalls right before its PATCH leaves; standby B takes over and,
for that router, has nothing to write (a rollback to the settings it holds, advisory mode, a
decision it already holds). Without B's barrier the router's revision would not move and A's
late PATCH would be accepted. Real Redis, the loopback API server and loopback frontends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from powerfleet.clock import FakeClock
from powerfleet.cluster.router import TIMEOUT_S as PATCH_TIMEOUT_S
from powerfleet.retune import control
from powerfleet.retune.context import Deployment
from powerfleet.retune.live import actuate
from tests.retune.conftest import make_ports, retune_config
from tests.retune.test_leadership import DECIDED, T0, _decide

INITIAL = {"temperature": 1.0, "prefill_load_scale": 1.0}


def _world(world: Any, kube: Any, redis_url: str) -> tuple[Any, Any, Any, Any, FakeClock]:
    """Routers retuned by A (term 1); B is a standby whose timer on A's Lease has run out."""
    fes = world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    a = make_ports(redis_url, kube, "ctl-a", FakeClock(T0, 1.0))
    a.r.flushdb()
    control.tick_deployment(cfg, a, "llama", T0)
    _decide(cfg, a)
    control.tick_deployment(cfg, a, "llama", T0)
    assert all(fe.policy.temperature == 0.0 for fe in fes.values())
    cb = FakeClock(T0, 5000.0)
    b = make_ports(redis_url, kube, "ctl-b", cb)
    assert control.tick_deployment(cfg, b, "llama", T0)["status"] == "standby"  # B's timer starts
    cb.advance(cfg.lease_duration_s)
    return fes, cfg, a, b, cb


def _pause_before_patch(ports: Any, takeover: Callable[[], None]) -> list[int]:
    """Run ``takeover`` once, after A's term check and before A's first policy PATCH leaves."""
    real = ports.router.patch
    fired: list[int] = []

    def patch(url: str, policy: dict[str, Any], revision: int) -> Any:
        if policy and not fired:
            fired.append(revision)
            takeover()
        return real(url, policy, revision)

    ports.router.patch = patch
    return fired


def _manual(fe: Any, policy: dict[str, float]) -> None:
    fe.patch(b'{"revision": %d, "policy": %s}' % (fe.revision, str(policy).replace("'", '"').encode()), "operator")


def _a_was_refused(fe: Any) -> bool:
    return any(w.leader == "ctl-a" and w.status == 409 for w in fe.writes)


def test_a_rollback_to_what_the_router_holds_still_fences_the_stale_patch(world, kube, redis_url) -> None:
    fes, cfg, a, b, cb = _world(world, kube, redis_url)
    held = fes[sorted(fes)[0]]
    _manual(held, INITIAL)  # this router is back on its initial settings: B's rollback writes nothing to it
    fired = _pause_before_patch(a, lambda: control.rollback(cfg, b, "llama"))
    out = control.tick_deployment(cfg, a, "llama", T0 + 5)
    assert fired and out["status"] == "fenced"
    assert _a_was_refused(held) and held.policy.temperature == 1.0
    cb.advance(PATCH_TIMEOUT_S)
    assert control.rollback(cfg, b, "llama")["status"] == "rolled-back"
    assert all(fe.policy.temperature == 1.0 and fe.policy.prefill_load_scale == 1.0 for fe in fes.values())


def test_an_advisory_switch_fences_the_stale_patch(world, kube, redis_url) -> None:
    fes, cfg, a, b, cb = _world(world, kube, redis_url)
    held = fes[sorted(fes)[0]]
    _manual(held, INITIAL)
    adv = retune_config(world, ["llama"], mode="advisory")
    fired = _pause_before_patch(a, lambda: control.tick_deployment(adv, b, "llama", T0 + 5))
    assert control.tick_deployment(cfg, a, "llama", T0 + 5)["status"] == "fenced" and fired
    assert _a_was_refused(held) and held.policy.temperature == 1.0
    cb.advance(PATCH_TIMEOUT_S)
    control.tick_deployment(adv, b, "llama", T0 + 15)
    dep = Deployment.open(adv, b, "llama")
    assert dep.store.read()[0].rollback == "done"
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())


def test_advisory_mode_writes_nothing_but_the_barrier_and_still_fences(world, kube, redis_url) -> None:
    fes, cfg, a, b, cb = _world(world, kube, redis_url)
    adv = retune_config(world, ["llama"], mode="advisory")
    dep_a = Deployment.open(cfg, a, "llama")
    term_a = dep_a.term_of("ctl-a", 1)
    stale = dep_a.store.read()[0]  # A read the active state, then stalled
    # Meanwhile (still under A's term) the deployment went advisory and its routers rolled back.
    control.tick_deployment(adv, a, "llama", T0 + 1)
    a.clock.advance(PATCH_TIMEOUT_S)
    control.tick_deployment(adv, a, "llama", T0 + 10)
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())
    assert control.tick_deployment(adv, b, "llama", T0 + 10)["status"] == "standby"  # A renewed: B waits again
    cb.advance(cfg.lease_duration_s)
    fired = _pause_before_patch(a, lambda: control.tick_deployment(adv, b, "llama", T0 + 20))
    try:
        actuate(dep_a, a, term_a, stale)
    except Exception as exc:  # Fenced: its retry re-checks the term
        assert "superseded" in str(exc)
    assert fired
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())
    assert any(_a_was_refused(fe) for fe in fes.values())


def test_a_normal_round_whose_decision_the_router_holds_fences_the_stale_patch(world, kube, redis_url) -> None:
    fes, cfg, a, b, cb = _world(world, kube, redis_url)
    held = fes[sorted(fes)[0]]
    newer = {**DECIDED, "temperature": 0.5}
    _manual(held, {"temperature": 0.5})  # the router holds what B is about to decide

    def takeover() -> None:
        dep_b = Deployment.open(cfg, b, "llama")
        t_b, _, _ = dep_b.leadership.claim()
        assert t_b is not None and t_b.term == 2
        dep_b.store.update(t_b, lambda s: s.model_copy(update={"desired": dict(newer), "desired_window": 2}))
        control.tick_deployment(cfg, b, "llama", T0 + 5)

    fired = _pause_before_patch(a, takeover)
    assert control.tick_deployment(cfg, a, "llama", T0 + 5)["status"] == "fenced" and fired
    assert _a_was_refused(held)
    assert all(fe.policy.temperature == 0.5 for fe in fes.values())  # B's decision, on every router
