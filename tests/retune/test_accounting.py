"""Every launched window ends in exactly one recorded outcome (issue 20 item 2).

The steps run in-process with an outbox for ``send``; Redis, the loopback API server and the
loopback frontends are real, the clocks are FakeClocks.
"""

from __future__ import annotations

from typing import Any

from powerfleet.clock import FakeClock
from powerfleet.retune import control, harvest, live
from powerfleet.retune.context import Deployment
from powerfleet.retune.fanin import ShardSpec
from powerfleet.retune.state import RetuneState
from powerfleet.retune.status import deployment_status
from tests.retune.conftest import make_ports, retune_config
from powerfleet.testing.retune_world import start_of, traffic_lines, write_segments

K = 29_000_300


def _setup(world: Any, kube: Any, redis_url: str, **over: Any) -> tuple[Any, Any, Any, FakeClock]:
    fes = world.add_deployment("llama")
    cfg = retune_config(world, ["llama"], **over)
    clock = FakeClock(start_of(K) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    ports.r.flushdb()
    assert control.tick_deployment(cfg, ports, "llama", clock.now())["status"] == "leader"  # enabled in K
    write_segments(world.trace_dir, "llama", sorted(fes), traffic_lines(60, start_of(K + 1)))
    clock.advance(start_of(K + 2) - start_of(K))  # window K+1 has closed
    return fes, cfg, ports, clock


def _state(cfg: Any, ports: Any) -> RetuneState:
    st = Deployment.open(cfg, ports, "llama").store.read()[0]
    assert st is not None
    return st


def _outcomes(st: RetuneState, k: int) -> list[tuple[str, str | None]]:
    return [(h.outcome, h.failure_reason) for h in st.history if h.window == k]


def _launch(cfg: Any, ports: Any) -> dict[str, Any]:
    assert control.tick_deployment(cfg, ports, "llama", ports.clock.now())["launched"] == [K + 1]
    (win,) = ports.send.of(control.WINDOW_TASK)
    out = live.launch_window(cfg, ports, "llama", win["window"], leader=win["leader"], term=win["term"],
                             generation=win["generation"])
    assert out["status"] == "launched", out
    return out


def _take_over(world: Any, kube: Any, redis_url: str, cfg: Any, at: float) -> Any:
    cb = FakeClock(at, 5000.0)
    b = make_ports(redis_url, kube, "ctl-b", cb)
    assert control.tick_deployment(cfg, b, "llama", at)["status"] == "standby"
    cb.advance(cfg.lease_duration_s)
    return b


def test_shards_finished_under_the_previous_leader_are_harvested_by_the_new_one(world, kube, redis_url) -> None:
    _, cfg, a, clock = _setup(world, kube, redis_url)
    sid = _launch(cfg, a)["sid"]
    for kw in a.send.of(live.SHARD_TASK):  # every shard computed; A dies before any harvest ran
        live.run_shard(a, sid, ShardSpec.model_validate(kw["spec"]))
    b = _take_over(world, kube, redis_url, cfg, clock.now())
    out = control.tick_deployment(cfg, b, "llama", b.clock.now())
    assert out["status"] == "leader" and out["term"] == 2 and out["harvest"] == [sid]
    harvested = harvest.harvest(cfg, b, sid)
    assert harvested["status"] == "decided"
    st = _state(cfg, b)
    assert [o for o, _ in _outcomes(st, K + 1)] in (["apply"], ["keep"]) and not st.pending
    assert st.history[-1].term == 2 and st.counts == {harvested["outcome"]: 1}


def test_a_configuration_change_mid_sweep_drops_the_window_with_its_reason(world, kube, redis_url) -> None:
    _, cfg, a, clock = _setup(world, kube, redis_url)
    sid = _launch(cfg, a)["sid"]
    changed = retune_config(world, ["llama"], max_shards=1)
    clock.advance(cfg.time_budget_s + 1)
    assert harvest.harvest(changed, a, sid)["status"] == "dropped"
    assert _outcomes(_state(cfg, a), K + 1) == [("dropped", "configuration-change")]
    assert harvest.harvest(changed, a, sid)["status"] == "dropped"  # final: no second outcome
    assert len(_outcomes(_state(cfg, a), K + 1)) == 1


def test_a_window_launched_by_a_leader_that_lost_its_term_is_dropped_once(world, kube, redis_url) -> None:
    _, cfg, a, clock = _setup(world, kube, redis_url)
    assert control.tick_deployment(cfg, a, "llama", clock.now())["launched"] == [K + 1]
    (win,) = a.send.of(control.WINDOW_TASK)  # the message has not run yet when A stalls
    b = _take_over(world, kube, redis_url, cfg, clock.now())
    out = control.tick_deployment(cfg, b, "llama", b.clock.now())
    assert out["dropped"] == [{"window": K + 1, "dropped": "leader-change"}]
    late = live.launch_window(cfg, a, "llama", win["window"], leader=win["leader"], term=win["term"],
                              generation=win["generation"])
    assert late["status"] == "dropped"
    assert _outcomes(_state(cfg, b), K + 1) == [("dropped", "leader-change")]


def test_a_redis_restart_without_persistence_loses_no_window_and_skips_none(world, kube, redis_url) -> None:
    fes, cfg, a, clock = _setup(world, kube, redis_url)
    _launch(cfg, a)
    a.r.flushdb()  # the broker restarted empty: sweep record, dedupe keys and schedule hashes gone
    clock.advance(cfg.time_budget_s + 1)
    out = control.tick_deployment(cfg, a, "llama", clock.now())
    assert out["launched"] == [] and out["dropped"] == [{"window": K + 1, "dropped": "lost-broker-state"}]
    write_segments(world.trace_dir, "llama", sorted(fes), traffic_lines(30, start_of(K + 2)), tag="next")
    clock.advance(start_of(K + 3) - clock.now() + 1)
    assert control.tick_deployment(cfg, a, "llama", clock.now())["launched"] == [K + 2]  # not skipped
    st = _state(cfg, a)
    assert st.enabled_at == start_of(K) + 1 and st.last_launched == K + 2 and [p.window for p in st.pending] == [K + 2]


def test_a_failed_send_after_the_claim_is_a_dropped_window(world, kube, redis_url) -> None:
    _, cfg, a, clock = _setup(world, kube, redis_url)

    def refuse(name: str, kwargs: dict[str, Any], opts: dict[str, Any]) -> None:
        raise ConnectionError("broker went away")

    a.send = refuse
    out = control.tick_deployment(cfg, a, "llama", clock.now())
    assert out["status"] == "leader" and out["launched"] == []
    st = _state(cfg, a)
    (rec,) = [h for h in st.history if h.window == K + 1]
    assert (rec.outcome, rec.failure_reason) == ("dropped", "send-failed") and "broker went away" in rec.reason
    assert not st.pending and st.counts == {"dropped": 1}
    (ev,) = [e for e in kube.list_events("default", involved_name="llama") if e.reason == "RetuneWindowDropped"]
    assert "send-failed" in ev.message and ev.type == "Warning"
    shown = deployment_status(cfg, kube, a.router, "llama", a.clock)["state"]
    assert shown["outcomes"] == {"decided": 0, "abandoned": 0, "dropped": 1, "skipped": 0, "by_outcome": {"dropped": 1}}
    assert shown["last_launched"] == K + 1 and shown["pending"] == []


def test_a_newer_configurations_window_drops_the_older_sweep_with_its_reason(world, kube, redis_url) -> None:
    fes, cfg, a, clock = _setup(world, kube, redis_url)
    old = _launch(cfg, a)["sid"]
    changed = retune_config(world, ["llama"], max_shards=1)
    write_segments(world.trace_dir, "llama", sorted(fes), traffic_lines(30, start_of(K + 2)), tag="next")
    clock.advance(start_of(K + 3) - clock.now() + 1)
    out = control.tick_deployment(changed, a, "llama", clock.now())
    assert out["launched"] == [K + 2]
    win = a.send.of(control.WINDOW_TASK)[-1]
    assert live.launch_window(changed, a, "llama", K + 2, leader=win["leader"], term=win["term"],
                              generation=win["generation"])["status"] == "launched"
    assert a.fanin.sweep(old).status == "dropped"
    assert _outcomes(_state(cfg, a), K + 1) == [("dropped", "configuration-change")]


def test_windows_that_close_during_a_tick_outage_are_recorded_skipped_and_counted(world, kube, redis_url) -> None:
    """Issue 33 item 3: after a three-window outage only the newest closed window is launched;
    the ones between end as ``skipped`` with their reason, in the counts and `retune status`."""
    from powerfleet.cli.retune_status_cmd import _text

    fes, cfg, a, clock = _setup(world, kube, redis_url)
    _launch(cfg, a)  # K+1
    clock.advance(3 * cfg.window_interval_s)  # K+2, K+3, K+4 close with no leader round
    out = control.tick_deployment(cfg, a, "llama", clock.now())
    assert out["launched"] == [K + 4], out
    st = _state(cfg, a)
    (gap,) = [h for h in st.history if h.outcome == "skipped"]
    assert (gap.window, gap.failure_reason) == (K + 3, "tick-outage") and f"windows {K + 2} to {K + 3} (2)" in gap.reason
    assert st.counts.get("skipped") == 2 and st.decided(K + 2) and st.decided(K + 3) and not st.decided(K + 4), st
    again = control.tick_deployment(cfg, a, "llama", clock.now() + 1)  # a second round records nothing more
    assert again["launched"] == [] and _state(cfg, a).counts.get("skipped") == 2
    status = deployment_status(cfg, a.cluster, a.router, "llama", a.clock)
    assert status["state"]["outcomes"]["skipped"] == 2, status["state"]["outcomes"]
    assert "1 dropped, 2 skipped (never launched)" in _text(status) or "0 dropped, 2 skipped (never launched)" in _text(status), _text(status)
    # A new leader after a gap says so.
    b = _take_over(world, kube, redis_url, cfg, clock.now() + 2 * cfg.window_interval_s)
    out = control.tick_deployment(cfg, b, "llama", b.clock.now())
    assert out["status"] == "leader" and out["launched"], out
    reasons = [h.failure_reason for h in _state(cfg, b).history if h.outcome == "skipped"]
    assert reasons[-1] == "leader-handover", reasons


def test_a_term_lost_between_the_steps_checks_drops_the_window_instead_of_raising(world, kube, redis_url,
                                                                                   monkeypatch) -> None:
    # CI, the short demo at its end: the leader's Lease was released by its shutdown while a window
    # step ran, and the step's state write raised Fenced out of the task ("raised unexpected")
    from powerfleet.retune.cut import CutError

    _, cfg, a, clock = _setup(world, kube, redis_url)
    assert control.tick_deployment(cfg, a, "llama", clock.now())["launched"] == [K + 1]
    (win,) = a.send.of(control.WINDOW_TASK)

    def released_then_failed(*args: Any, **kwargs: Any) -> Any:
        assert Deployment.open(cfg, a, "llama").leadership.release()  # the shutdown, mid-step
        raise CutError("the window's segments went away")  # the step then records an outcome

    monkeypatch.setattr(live, "cut_window", released_then_failed)
    out = live.launch_window(cfg, a, "llama", win["window"], leader=win["leader"], term=win["term"],
                             generation=win["generation"])
    assert out["status"] == "dropped" and "superseded" in out["reason"], out
