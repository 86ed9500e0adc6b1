"""A disaggregated deployment's live window is swept by the disaggregated model (issue 20
item 4): its shards replay a prefill pool and a decode pool with the KV transfer between them,
the window ends decided, and the decision is what ``run_sweep`` over the same pools decides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from powerfleet.clock import FakeClock
from powerfleet.retune import control, harvest, live
from powerfleet.retune.context import Deployment
from powerfleet.retune.fanin import DisaggSpec, ShardSpec
from powerfleet.retune.settings import pools, sweep_options
from powerfleet.retune.sweep import run_sweep
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.trace import read_trace
from powerfleet.testing.retune_world import INTERVAL, START_POLICY, dgd_object, start_of, traffic_lines, write_segments
from tests.retune.conftest import make_ports, retune_config

DGD = "llm-disagg"


def _launch(world: Any, kube: Any, redis_url: str, k: int, lines: list[str], **over: Any) -> tuple[Any, Any, dict[str, Any]]:
    fes = world.add_deployment(DGD, prefill=3, workers=2)
    cfg = retune_config(world, [DGD], **over)
    clock = FakeClock(start_of(k) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    ports.r.flushdb()
    assert control.tick_deployment(cfg, ports, DGD, clock.now())["status"] == "leader"
    write_segments(world.trace_dir, DGD, sorted(fes), lines, tag=f"w{k}")
    clock.advance(start_of(k + 2) - start_of(k))
    control.tick_deployment(cfg, ports, DGD, clock.now())
    (win,) = ports.send.of(control.WINDOW_TASK)
    out = live.launch_window(cfg, ports, DGD, win["window"], leader=win["leader"], term=win["term"],
                             generation=win["generation"])
    assert out["status"] == "launched", out  # no premise refuses it any more
    for kw in ports.send.of(live.SHARD_TASK):
        assert live.run_shard(ports, out["sid"], ShardSpec.model_validate(kw["spec"]))["status"] == "computed"
    return cfg, ports, out


def test_a_disaggregated_window_is_decided_by_the_disaggregated_model(world, kube, redis_url, tmp_path: Path) -> None:
    k = 29_000_700
    lines = traffic_lines(40, start_of(k), seed=3) + traffic_lines(60, start_of(k + 1), seed=7)
    cfg, ports, launched = _launch(world, kube, redis_url, k, lines, kv_transfer_gb_s=32.0)
    specs = [ShardSpec.model_validate(kw["spec"]) for kw in ports.send.of(live.SHARD_TASK)]
    assert {(s.replicas, s.disagg) for s in specs} == {(2, DisaggSpec(prefill_replicas=3, kv_transfer_gb_s=32.0))}
    # the prefill load scale cannot change this replay (no active-request weight): held, not swept
    pts = [p for s in specs if s.kind != "probe" for p in s.points]
    assert sorted((p["temperature"], p["prefill_load_scale"]) for p in pts) == [(0.0, 1.0), (1.0, 1.0)]
    out = harvest.harvest(cfg, ports, launched["sid"])
    assert out["status"] == "decided" and out["outcome"] in ("apply", "keep"), out
    rec = Deployment.open(cfg, ports, DGD).store.read()[0].history[-1]
    assert rec.outcome in ("apply", "keep") and rec.replicas_verified
    assert launched["held_knobs"] == ["prefill_load_scale"] and rec.reason.endswith(
        "held at the current value (no effect on this replay): prefill_load_scale")
    from powerfleet.retune.status import deployment_status
    shown = deployment_status(cfg, kube, ports.router, DGD, ports.clock)["replayed_as"]
    assert shown == {"kind": "disaggregated", "prefill_workers": 3, "decode_workers": 2, "kv_transfer_gb_s": 32.0,
                     "prefill_engine_profile": {"name": "h200-llama3-70b-tp4", "source": "built-in (fallback)"}}

    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(lines) + "\n")
    reqs = read_trace(str(path)).requests
    settings = Deployment.open(cfg, ports, DGD).settings
    start = start_of(k + 1) - min(r.timestamp_ms for r in reqs) / 1000.0
    kw: dict[str, Any] = dict(window=(start, start + INTERVAL), processes=1, **sweep_options(settings))
    current = RouterPolicy.model_validate(START_POLICY)
    local = run_sweep(reqs, pools(settings, 3, 2), settings.objective, current, settings.grid, **kw)
    assert (rec.outcome, rec.params) == (local.decision.action, local.decision.params)
    assert rec.probe_score == local.probe.score and local.workers == 5
    assert local.held_knobs == ["prefill_load_scale"] and local.grid_points == len(pts)
    assert [c["score"] for c in rec.ranking] == [c.score for c in local.decision.ranked[:5]]
    # the model decides it: the same window replayed as five aggregated workers scores otherwise
    assert run_sweep(reqs, 5, settings.objective, current, settings.grid, **kw).probe.score != local.probe.score


def test_a_prefill_pool_resized_during_the_sweep_abandons_the_window(world, kube, redis_url) -> None:
    k = 29_000_720
    cfg, ports, launched = _launch(world, kube, redis_url, k, traffic_lines(30, start_of(k + 1), seed=5))
    world.api.apply(dgd_object(DGD, prefill=4, workers=2))  # the decode pool is unchanged
    out = harvest.harvest(cfg, ports, launched["sid"])
    rec = Deployment.open(cfg, ports, DGD).store.read()[0].history[-1]
    assert out["status"] == "abandoned" and rec.failure_reason == "replicas-changed"


def test_the_harvests_edge_search_holds_the_no_effect_scale_too(world, kube, redis_url) -> None:
    # the live search rounds take their axes from the same held grid as the launch: a best on
    # the scale's smallest grid value (1 of {1, 4}) must not step it to 0.5
    k = 29_000_740
    lines = traffic_lines(40, start_of(k), seed=3) + traffic_lines(60, start_of(k + 1), seed=7)
    cfg, ports, launched = _launch(world, kube, redis_url, k, lines, search_rounds=2)
    before = len(ports.send.of(live.SHARD_TASK))
    out = harvest.harvest(cfg, ports, launched["sid"])
    assert out["status"] in ("searching", "decided"), out
    searched = [ShardSpec.model_validate(kw["spec"]) for kw in ports.send.of(live.SHARD_TASK)[before:]]
    assert all(s.kind == "search" for s in searched)
    assert [p["prefill_load_scale"] for s in searched for p in s.points] == [1.0] * sum(len(s.points) for s in searched)
    assert out["status"] == "decided" or searched
