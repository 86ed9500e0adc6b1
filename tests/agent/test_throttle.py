"""The power guard's overlay inside the agent (agent/throttle.py): min(annotation cap, overlay) while
fresh, the safe cap once the overlays stop (TTL on the agent's clock), back when they resume; and
the watch that asks for that pass within one period. Injected clock, no sleeps."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from powerfleet.agent.throttle import FallbackWatch, OverlayStore
from powerfleet.power.overlay import Overlay
from tests.agent.conftest import Bench


def overlay(bench: Bench, revision: int, caps: dict[str, float], period_s: float = 1.0,
            group: str = "rack-a") -> Overlay:
    """Issued now by the bench's clock (the guard's and the agent's clocks agree)."""
    return Overlay(node="node-a", group=group, caps=caps, safe={"GPU-0000": 400.0, "GPU-0001": 400.0},
                   period_s=period_s, revision=revision, issued_at=bench.clock.now())


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_pass_enforces_the_lower_of_annotation_and_overlay_then_the_safe_cap_once_overlays_stop(bench: Bench) -> None:
    bench.pod("decode", "600", pids=(101,))
    bench.pod("prefill", "300", pids=(102,))
    bench.set_pids(0, [101])
    bench.set_pids(1, [102])
    agent = bench.agent()
    registry = CollectorRegistry()
    agent.overlays = OverlayStore(bench.clock, registry)
    assert bench.limits() == [700, 700]
    agent.run_pass()
    assert bench.limits() == [600, 300]  # no overlay yet: the annotation caps

    assert agent.overlays.receive(overlay(bench, 1, {"GPU-0000": 450.0, "GPU-0001": 350.0}))
    report = agent.run_pass()
    assert bench.limits() == [450, 300]  # 450 < 600 lowers; 350 > 300: the annotation's lower cap stays
    g0, g1 = report.gpus
    assert (g0.requested_w, g0.cap_w, g0.overlay) == (600, 450, "throttle")  # both in the report
    assert (g1.requested_w, g1.cap_w, g1.overlay) == (300, 300, "annotation")

    bench.clock.advance(1.5)  # the next overlay is due at +1 and not late yet at +1.5
    agent.run_pass()
    assert bench.limits() == [450, 300]
    bench.clock.advance(0.01)
    report = agent.run_pass()
    assert bench.limits() == [400, 300]  # the safe cap, never above the annotation cap
    assert report.gpus[0].overlay == "fallback"
    bench.clock.advance(60)
    agent.run_pass()
    assert bench.limits() == [400, 300]  # held until the guard is back

    assert agent.overlays.receive(overlay(bench, 2, {}))  # back, nothing throttled
    agent.run_pass()
    assert bench.limits() == [600, 300]


def test_an_older_revision_is_ignored_and_an_overlay_that_does_not_name_a_gpu_leaves_it_alone(bench: Bench) -> None:
    store = OverlayStore(bench.clock)
    assert store.receive(overlay(bench, 5, {"GPU-0000": 450.0}))
    assert not store.receive(overlay(bench, 4, {"GPU-0000": 250.0}))
    assert store.limit_mw("GPU-0000", 600_000, 200_000, 700_000)[0] == 450_000
    assert store.limit_mw("GPU-0009", 600_000, 200_000, 700_000) == (600_000, None)
    # a throttle below the card's minimum is held at the minimum
    assert store.receive(overlay(bench, 6, {"GPU-0000": 150.0}))
    assert store.limit_mw("GPU-0000", 600_000, 200_000, 700_000)[0] == 200_000


def test_the_watch_asks_for_one_pass_per_lapse_within_one_period_and_counts_it(bench: Bench) -> None:
    registry = CollectorRegistry()
    store = OverlayStore(bench.clock, registry)
    asked: list[str] = []
    watch = FallbackWatch(store, asked.append)
    assert watch.check_once() == [] and asked == []  # nothing held: nothing to fall back from
    store.receive(overlay(bench, 1, {}, period_s=2.0))
    # the watch looks every quarter period; the overlay due at +2 s lapses after +3 s: the pass is
    # asked for at the first look after that, +3.5 s at the latest, within one period of the due time
    looks = [0.5 * k for k in range(1, 8)]
    lapsed_at = None
    for t in looks:
        bench.clock.advance(0.5)
        if watch.check_once():
            lapsed_at = t
            break
    assert lapsed_at is not None and 3.0 < lapsed_at <= 2.0 + 2.0
    assert asked == ["power guard overlays lapsed (rack-a): safe caps"]
    assert watch.check_once() == [] and len(asked) == 1  # once per lapse
    assert sample(registry, "powerfleet_agent_power_fallback_activations_total", group="rack-a") == 1
    assert sample(registry, "powerfleet_agent_power_fallback", group="rack-a") == 1
    store.receive(overlay(bench, 2, {}, period_s=2.0))
    assert sample(registry, "powerfleet_agent_power_fallback", group="rack-a") == 0
    bench.clock.advance(3.1)
    assert watch.check_once() == ["rack-a"]
    assert sample(registry, "powerfleet_agent_power_fallback_activations_total", group="rack-a") == 2


def test_an_unthrottled_gpu_above_its_safe_cap_goes_to_it_too_once_the_overlays_stop(bench: Bench) -> None:
    # issue 37 finding 5: the fallback must not skip the GPUs the last overlay left unthrottled
    store = OverlayStore(bench.clock)
    assert store.receive(overlay(bench, 1, {"GPU-0000": 350.0}))  # GPU-0001 not throttled: its annotation cap
    assert store.limit_mw("GPU-0001", 600_000, 200_000, 700_000)[0] == 600_000
    bench.clock.advance(1.51)
    assert store.limit_mw("GPU-0001", 600_000, 200_000, 700_000)[0] == 400_000  # its safe cap
    assert store.limit_mw("GPU-0000", 600_000, 200_000, 700_000)[0] == 400_000
    assert store.resolve("GPU-0001", 600.0)[0].why == "fallback"


def test_a_restarted_agent_falls_back_from_its_own_state_and_lifts_only_on_a_fresh_overlay(bench: Bench) -> None:
    path = bench.tmp / "state" / "node-a" / "overlays.json"
    first = OverlayStore(bench.clock, path=path, groups={"rack-a"})
    assert first.receive(overlay(bench, 7, {"GPU-0000": 450.0}))
    written = path.stat().st_mtime_ns
    assert first.receive(overlay(bench, 8, {"GPU-0000": 430.0}))  # same safe caps: not written again
    assert path.stat().st_mtime_ns == written
    # a new process, no Redis, no guard: safe caps from its first pass, however recent the file
    registry = CollectorRegistry()
    again = OverlayStore(bench.clock, registry, path=path, groups={"rack-a"})
    assert again.limit_mw("GPU-0000", 600_000, 200_000, 700_000)[0] == 400_000
    assert again.resolve("GPU-0001", 600.0)[0].why == "fallback"
    assert again.lapsed_now() == ["rack-a"]  # counted and logged as a fallback once
    assert sample(registry, "powerfleet_agent_power_fallback", group="rack-a") == 1
    assert not again.receive(overlay(bench, 6, {}))  # an older revision lifts nothing
    assert again.receive(overlay(bench, 9, {}))  # a fresh one does
    assert again.limit_mw("GPU-0000", 600_000, 200_000, 700_000)[0] == 600_000
    # a group the configuration no longer oversubscribes is not read back; a corrupt file is none
    assert OverlayStore(bench.clock, path=path, groups=set()).limit_mw("GPU-0000", 600_000, 200_000,
                                                                       700_000) == (600_000, None)
    path.write_text("{not json")
    assert OverlayStore(bench.clock, path=path, groups={"rack-a"}).resolve("GPU-0000", 600.0)[1] is None
