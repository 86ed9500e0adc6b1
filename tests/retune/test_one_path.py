"""One sweep path: a live window (cut with its warm-up, shards, edge-search rounds, harvest)
decides exactly what ``run_sweep`` -- what `retune sweep` and bench/retune.py run -- decides
on the same traffic with the same options (issue 20 item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerfleet.clock import FakeClock
from powerfleet.retune import control, harvest, live
from powerfleet.retune.context import Deployment
from powerfleet.retune.fanin import ShardSpec
from powerfleet.retune.settings import sweep_options
from powerfleet.retune.sweep import run_shard_from_trace, run_sweep
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.trace import TraceError, read_trace
from tests.retune.conftest import launch_window_k1, make_ports, retune_config
from powerfleet.testing.retune_world import INTERVAL, START_POLICY, start_of, traffic_lines, write_segments

K = 29_000_400


def test_the_live_window_decides_what_run_sweep_decides(world, kube, redis_url, tmp_path: Path) -> None:
    world.add_deployment("llama")
    cfg = retune_config(world, ["llama"], search_rounds=6, min_improvement_percentage=1.0)
    lines = traffic_lines(40, start_of(K), seed=3) + traffic_lines(60, start_of(K + 1), seed=7)
    ports, launched = launch_window_k1(world, kube, redis_url, cfg, K, lines)
    assert launched["status"] == "launched" and launched["warmup_requests"] == 40 and launched["requests"] == 60
    sid, done, rounds = launched["sid"], 0, 0
    for _ in range(20):  # run every shard sent so far, then harvest; a search round sends one more
        shards = ports.send.of(live.SHARD_TASK)
        for kw in shards[done:]:
            assert live.run_shard(ports, sid, ShardSpec.model_validate(kw["spec"]))["status"] == "computed"
        done = len(shards)
        out = harvest.harvest(cfg, ports, sid)
        if out["status"] != "searching":
            break
        rounds += 1
    assert out["status"] == "decided" and rounds >= 1, out  # the best sat on the grid's edge
    rec = Deployment.open(cfg, ports, "llama").store.read()[0].history[-1]

    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(lines) + "\n")
    reqs = read_trace(str(path)).requests
    settings = Deployment.open(cfg, ports, "llama").settings
    t0 = min(r.timestamp_ms for r in reqs) / 1000.0
    start = start_of(K + 1) - t0
    local = run_sweep(reqs, 4, settings.objective, RouterPolicy.model_validate(START_POLICY), settings.grid,
                      window=(start, start + INTERVAL), processes=1, **sweep_options(settings))
    d = local.decision
    assert rec.outcome == d.action and rec.params == d.params
    assert rec.probe_score == local.probe.score and rec.best_score == (d.best.score if d.best else None)
    assert rec.candidates == len(local.candidates) and local.search_points == sum(
        len(kw["spec"]["points"]) for kw in ports.send.of(live.SHARD_TASK) if kw["spec"]["kind"] == "search")
    assert [c["score"] for c in rec.ranking] == [c.score for c in d.ranked[:5]]


def test_a_deployments_own_engine_profile_is_what_its_shards_replay(world, kube, redis_url, tmp_path: Path) -> None:
    import json

    from powerfleet.retune.settings import SettingsError, resolve
    from powerfleet.retune.status import deployment_status

    spec = {"name": "slow-gpu", "source": "test", "gpus_per_replica": 2, "kv_capacity_tokens": 200000,
            "prefill": {"tokens": [0, 1000, 40000], "ms": [20, 220, 9000]},
            "decode": {"batch": [1, 64], "kv_tokens": [0, 200000], "ms": [[20, 40], [30, 90]]}}
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(spec))
    fes = world.add_deployment("llama")
    builtin = retune_config(world, ["llama"])
    own = retune_config(world, ["llama"], per_deployment={"llama": {"engine_profile": str(prof)}})
    assert resolve(own, "llama").engine_profile_name == "slow-gpu"
    assert resolve(own, "llama").generation != resolve(builtin, "llama").generation
    with pytest.raises(SettingsError, match="engine_profile"):
        resolve(retune_config(world, ["llama"], engine_profile=str(tmp_path / "missing.json")), "llama")
    clock = FakeClock(start_of(K + 10) + 1, 1.0)
    ports = make_ports(redis_url, kube, "ctl-a", clock)
    ports.r.flushdb()
    assert deployment_status(builtin, kube, ports.router, "llama", clock)["engine_profile"]["source"] == \
        "built-in (fallback)"
    control.tick_deployment(own, ports, "llama", clock.now())
    write_segments(world.trace_dir, "llama", sorted(fes), traffic_lines(40, start_of(K + 11), seed=5), tag="own")
    clock.advance(start_of(K + 12) - start_of(K + 10))
    control.tick_deployment(own, ports, "llama", clock.now())
    (win,) = ports.send.of(control.WINDOW_TASK)
    out = live.launch_window(own, ports, "llama", win["window"], leader=win["leader"], term=win["term"],
                             generation=win["generation"])
    probe = ShardSpec.model_validate(ports.send.of(live.SHARD_TASK)[0]["spec"])
    assert out["status"] == "launched" and probe.profile == str(prof)
    live.run_shard(ports, out["sid"], probe)
    scored = ports.fanin.result(probe.key())
    assert scored is not None and scored.error is None
    def replayed(profile: str | None) -> float | None:
        return run_shard_from_trace(probe.window_file, probe.replicas, probe.points, objective="ttft",
                                    warmup_s=probe.start_s or None, warmup_policy=probe.warm_policy,
                                    profile=profile)[0].score

    assert replayed(str(prof)) == scored.candidates[0]["score"] != replayed(None)  # the profile decides it


def test_a_shard_process_reuses_the_prepared_window_and_scores_the_same(tmp_path: Path) -> None:
    """Live shards of one window in one process prepare it (read, cut, warm-up replay) once:
    the next shard scores exactly what a fresh read scores, without reading the file again."""
    lines = traffic_lines(40, start_of(K), seed=3) + traffic_lines(60, start_of(K + 1), seed=7)
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(lines) + "\n")
    args = dict(objective="ttft", warmup_s=float(INTERVAL), warmup_policy=START_POLICY)
    points = [{"temperature": 0.0}, {"temperature": 1.0, "prefill_load_scale": 4.0}]
    cold = run_shard_from_trace(str(path), 4, points, **args)
    first = run_shard_from_trace(str(path), 4, points[:1], cache_key="sha-of-w", **args)
    path.unlink()  # the next shard of the same window must not need the file
    second = run_shard_from_trace(str(path), 4, points[1:], cache_key="sha-of-w", **args)
    assert [c.model_dump() for c in first + second] == [c.model_dump() for c in cold]
    with pytest.raises(TraceError, match="cannot open"):  # another window (key) is read afresh
        run_shard_from_trace(str(path), 4, points, cache_key="sha-of-another", **args)
