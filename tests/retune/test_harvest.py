"""The harvest decides with what arrived by the deadline; an overrun sweep is abandoned.

Shards run in-process here (the worker path is covered by test_live_e2e.py); Redis, the
loopback API server and frontends are real, and the clock is a FakeClock.
"""

from __future__ import annotations

import os

from powerfleet.clock import FakeClock
from powerfleet.retune import control, harvest, live
from powerfleet.retune.context import Deployment
from powerfleet.retune.fanin import ShardSpec
from powerfleet.testing.retune_world import INTERVAL, start_of, traffic_lines, write_segments
from powerfleet.retune.state import Moved
from powerfleet.retune.sweep import forget_prepared
from tests.retune.conftest import make_ports, retune_config

K = 29_000_100


def _launch(world, kube, redis_url, **over):  # type: ignore[no-untyped-def]
    fes = world.add_deployment("llama")
    cfg = retune_config(world, ["llama"], **over)
    clock = FakeClock(start_of(K + 1) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    ports.r.flushdb()  # the Redis server is shared by the module's tests
    assert control.tick_deployment(cfg, ports, "llama", start_of(K) + 1)["status"] == "leader"
    write_segments(world.trace_dir, "llama", sorted(fes), traffic_lines(60, start_of(K + 1)))
    clock.advance(start_of(K + 2) - start_of(K + 1))  # window K+1 has closed
    t = control.tick_deployment(cfg, ports, "llama", clock.now())["term"]
    (win,) = ports.send.of(control.WINDOW_TASK)
    out = live.launch_window(cfg, ports, "llama", win["window"], leader=win["leader"], term=win["term"],
                             generation=win["generation"])
    assert out["status"] == "launched", out
    shards = ports.send.of(live.SHARD_TASK)
    return fes, cfg, ports, clock, out["sid"], shards, t


def _run(ports, sid, spec):  # type: ignore[no-untyped-def]
    return live.run_shard(ports, sid, ShardSpec.model_validate(spec))


def test_a_shard_that_fails_fails_only_its_candidates_and_the_deadline_decides(world, kube, redis_url) -> None:
    fes, cfg, ports, clock, sid, shards, _ = _launch(world, kube, redis_url)
    probe, first, second = (kw["spec"] for kw in shards)
    assert probe["kind"] == "probe" and len(shards) == 3
    assert _run(ports, sid, probe)["status"] == "computed"
    broken = dict(first, window_file=first["window_file"] + ".gone")
    assert _run(ports, sid, broken)["status"] == "dropped"  # not a spec of this sweep
    # The second shard never arrives; the first one fails (its window file disappeared), in a
    # process that has not prepared the window yet (this one has, for the probe).
    os.rename(first["window_file"], first["window_file"] + ".moved")
    forget_prepared()
    failed = _run(ports, sid, first)
    assert failed["status"] == "failed"
    os.rename(first["window_file"] + ".moved", first["window_file"])
    assert harvest.harvest(cfg, ports, sid)["status"] == "waiting"  # before the deadline
    clock.advance(cfg.time_budget_s + 1)
    out = harvest.harvest(cfg, ports, sid)
    assert out["status"] == "abandoned" and "time budget" in out["reason"]  # no candidate scored
    state = Deployment.open(cfg, ports, "llama").store.read()[0]
    rec = state.history[-1]
    assert rec.failure_reason == "time-budget" and rec.candidates == 4 and rec.candidates_failed == 4
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())


def test_partial_results_at_the_deadline_still_decide(world, kube, redis_url) -> None:
    fes, cfg, ports, clock, sid, shards, _ = _launch(world, kube, redis_url)
    probe, first, _second = (kw["spec"] for kw in shards)
    _run(ports, sid, probe)
    _run(ports, sid, first)
    clock.advance(cfg.time_budget_s + 1)
    out = harvest.harvest(cfg, ports, sid)
    assert out["status"] == "decided", out
    state = Deployment.open(cfg, ports, "llama").store.read()[0]
    rec = state.history[-1]
    assert rec.candidates == 4 and rec.candidates_failed == 2 and rec.replicas_verified
    assert harvest.harvest(cfg, ports, sid)["status"] == "decided"  # a second harvest changes nothing
    assert len(Deployment.open(cfg, ports, "llama").store.read()[0].history) == len(state.history)


def test_a_window_kept_in_redis_needs_no_shared_volume(world, kube, redis_url) -> None:
    fes, cfg, ports, clock, sid, shards, _ = _launch(world, kube, redis_url, window_store="redis")
    ref = shards[0]["spec"]["window_file"]
    assert ref.startswith("redis:") and ports.r.exists(ref[len("redis:"):])
    assert not any((world.trace_dir / "windows" / "llama").iterdir())  # nothing left on the volume
    for kw in shards:
        assert _run(ports, sid, kw["spec"])["status"] == "computed"
    out = harvest.harvest(cfg, ports, sid)
    assert out["status"] == "decided" and out["outcome"] == "apply"
    assert all(fe.policy.temperature == 0.0 for fe in fes.values())
    assert not ports.r.exists(ref[len("redis:"):])  # removed with the final sweep
    rec = Deployment.open(cfg, ports, "llama").store.read()[0].history[-1]
    assert rec.requests == 60 and rec.confidence is not None and rec.runner_up_margin_pct is not None
    assert rec.ranking and rec.ranking[0]["params"] == rec.params and len(rec.ranking) <= 5
    applied = [e for e in kube.list_events("default", involved_name="llama") if e.reason == "RetuneApplied"]
    assert len(applied) == 1 and "temperature=0" in applied[0].message
    moved = Deployment.open(cfg, ports, "llama").store.read()[0].moves["temperature"]
    assert (moved.window, moved.previous) == (K + 1, 1.0)  # the dwell's memory of this move


def test_the_guard_keeps_a_window_with_too_few_requests(world, kube, redis_url) -> None:
    fes, cfg, ports, clock, sid, shards, _ = _launch(world, kube, redis_url, min_requests=61)
    for kw in shards:
        _run(ports, sid, kw["spec"])
    out = harvest.harvest(cfg, ports, sid)
    assert out["outcome"] == "keep" and "only 60 requests" in out["reason"]
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())


def test_the_dwell_keeps_a_parameter_that_would_move_back_too_soon(world, kube, redis_url) -> None:
    fes, cfg, ports, clock, sid, shards, t = _launch(world, kube, redis_url, dwell_s=3 * INTERVAL)
    dep = Deployment.open(cfg, ports, "llama")
    term = dep.leadership.claim()[0]
    # temperature moved 0 -> 1 at window K: the sweep's wish to go back to 0 must wait.
    dep.store.update(term, lambda s: s.model_copy(update={"moves": {"temperature": Moved(window=K, previous=0.0)}}))
    for kw in shards:
        _run(ports, sid, kw["spec"])
    out = harvest.harvest(cfg, ports, sid)
    assert out["outcome"] == "keep" and "moving it back" in out["reason"], out
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())


def test_a_keep_for_the_dwell_still_says_how_the_window_was_swept(world, kube, redis_url) -> None:
    fes, cfg, ports, clock, sid, shards, t = _launch(world, kube, redis_url, dwell_s=3 * INTERVAL)
    dep = Deployment.open(cfg, ports, "llama")
    term = dep.leadership.claim()[0]
    dep.store.update(term, lambda s: s.model_copy(update={"moves": {"temperature": Moved(window=K, previous=0.0)}}))
    rec = ports.fanin.sweep(sid)
    ports.fanin.save(rec.model_copy(update={"extra": {**rec.extra, "shift": "requests rate x2.00 (t +9.0)",
                                                           "held_knobs": ["prefill_load_scale"]}}))
    for kw in shards:
        _run(ports, sid, kw["spec"])
    out = harvest.harvest(cfg, ports, sid)
    assert out["outcome"] == "keep" and "moving it back" in out["reason"], out
    assert "scored from the load change: requests rate x2.00" in out["reason"], out
    assert "held at the current value (no effect on this replay): prefill_load_scale" in out["reason"], out


def test_a_window_whose_outcome_is_recorded_first_is_never_counted_as_decided_by_its_sweep(world, kube,
                                                                                           redis_url) -> None:
    """Issue 33 item 3: a new leader dropped the window while the old leader's sweep ran; the
    harvest saves nothing, and neither the sweep record nor the metrics say decided."""
    from powerfleet.retune.accounting import drop
    from powerfleet.retune.metrics import WINDOWS

    fes, cfg, ports, clock, sid, shards, t = _launch(world, kube, redis_url)
    for kw in shards:
        assert _run(ports, sid, kw["spec"])["status"] == "computed"
    dep = Deployment.open(cfg, ports, "llama")
    term = dep.term_of("ctl-a", t)
    assert drop(dep, term, K + 1, "leader-change", "dropped by the next leader", clock.now()) is not None

    def count(status: str, reason: str) -> float:
        return WINDOWS.labels("llama", status, reason)._value.get()

    decided, superseded = count("decided", "apply") + count("decided", "keep"), count("superseded", "outcome-recorded")
    out = harvest.harvest(cfg, ports, sid)
    assert out["status"] == "superseded" and out["saved"] is False, out
    assert ports.fanin.sweep(sid).status == "dropped", ports.fanin.sweep(sid)
    assert count("decided", "apply") + count("decided", "keep") == decided, out
    assert count("superseded", "outcome-recorded") == superseded + 1, out
    state = dep.store.read()[0]
    (rec,) = [h for h in state.history if h.window == K + 1]
    assert (rec.outcome, rec.failure_reason) == ("dropped", "leader-change") and state.desired is None, state
    assert all(fe.policy.temperature == 1.0 for fe in fes.values())  # no router written


def test_a_handover_during_the_cut_registers_no_sweep(world, kube, redis_url, monkeypatch) -> None:
    """The term is checked again right before the sweep is registered."""
    from powerfleet.retune.leadership import leader_lease_name

    fes = world.add_deployment("llama")
    cfg = retune_config(world, ["llama"])
    clock = FakeClock(start_of(K + 1) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    ports.r.flushdb()
    assert control.tick_deployment(cfg, ports, "llama", start_of(K) + 1)["status"] == "leader"
    write_segments(world.trace_dir, "llama", sorted(fes), traffic_lines(60, start_of(K + 1)))
    clock.advance(start_of(K + 2) - start_of(K + 1))
    control.tick_deployment(cfg, ports, "llama", clock.now())
    (win,) = ports.send.of(control.WINDOW_TASK)
    real_cut = live.cut_window

    def cut_then_hand_over(*a, **kw):  # type: ignore[no-untyped-def]
        res = real_cut(*a, **kw)
        lease = kube.get_lease("default", leader_lease_name("llama"))
        kube.update_lease(lease.model_copy(update={"holder_identity": "ctl-b",
                                                   "lease_transitions": (lease.lease_transitions or 0) + 1}))
        return res

    monkeypatch.setattr(live, "cut_window", cut_then_hand_over)
    out = live.launch_window(cfg, ports, "llama", win["window"], leader=win["leader"], term=win["term"],
                             generation=win["generation"])
    assert out["status"] == "dropped" and "superseded" in out["reason"], out
    assert ports.fanin.active("llama") == [] and not ports.send.of(live.SHARD_TASK), out
