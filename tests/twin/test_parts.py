"""The twin's simulated parts: power model, traffic replay, GPU nodes and proc root, frontends."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.agent.cgroup import pod_uid_for_pid
from powerfleet.agent.simulated import SimulatedGpus
from powerfleet.sim.trace import read_trace
from powerfleet.twin.serving.frontends import TwinFrontend
from powerfleet.twin.gpus.nodes import SYSTEM_PID, NodeSim
from powerfleet.twin.gpus.power import IDLE_W, gpu_power
from powerfleet.twin.cluster.topology import TwinSpec
from powerfleet.twin.serving.traffic import TrafficSource, synthetic_requests


@settings(max_examples=500, deadline=None)
@given(role=st.sampled_from([None, "prefill", "decode", "worker", "planner"]),
       load=st.floats(-1, 2, allow_nan=False), cap=st.floats(200, 700), seed=st.integers(0, 2**32))
def test_draw_never_exceeds_the_cap_and_follows_load(role, load, cap, seed) -> None:
    p = gpu_power(role, load, cap, random.Random(seed))
    assert 0 <= p.draw_w <= cap
    assert p.capped == (p.demand_w > cap)
    assert 0 < p.speed <= 1.0


def test_prefill_slows_under_a_binding_cap_and_decode_does_not_at_450w() -> None:
    assert gpu_power("prefill", 1.0, 400).speed < 0.9
    assert gpu_power("decode", 1.0, 450).speed == 1.0
    assert gpu_power(None, 1.0, 700).draw_w == IDLE_W
    assert gpu_power("prefill", 0.9, 700).draw_w > gpu_power("prefill", 0.2, 700).draw_w


def test_traffic_keeps_the_rate_compresses_time_and_loops() -> None:
    reqs = synthetic_requests(seed=3, span_s=600, rate=4.0)
    src = TrafficSource.from_requests("d", reqs, speedup=10, seed=3)
    got = []
    for t in range(1, 121):  # 120 wall s = 1200 trace s: the 600 s trace twice
        got.extend(src.due(t))
    rate = len(got) / 120
    assert 3.0 < rate < 5.0  # the recorded rate (4/s), not 10x it
    assert sorted(r.timestamp_ms for r in got) == [r.timestamp_ms for r in got]
    assert got[-1].timestamp_ms > src.span_ms  # second lap, later timestamps
    assert src.due(120) == []  # nothing twice


def test_traffic_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="no requests"):
        TrafficSource.from_requests("d", [], speedup=10)
    with pytest.raises(ValueError, match="speedup"):
        TrafficSource.from_requests("d", synthetic_requests(0, 10), speedup=0)


def _pod(name: str, uid: str, gpus: str | None, phase: str = "Running") -> dict:
    ann = {"twin.powerfleet.io/gpus": gpus} if gpus is not None else {}
    return {"metadata": {"name": name, "uid": uid, "labels": {"nvidia.com/dynamo-component": "decode"},
                         "annotations": ann}, "status": {"phase": phase}}


UID_A = "0b6f3c52-8f0e-4a53-9c59-0d2f6a1f9e10"
UID_B = "9d2a4c11-1e2b-4c3d-8e4f-5a6b7c8d9e0f"


def test_node_processes_map_to_their_pods_and_vanish_with_them(tmp_path: Path) -> None:
    node = NodeSim("twin-gpu-00", 4, tmp_path)
    pods = [_pod("a", UID_A, "0,1"), _pod("b", UID_B, None), _pod("c", "pending-uid", "2", phase="Pending")]
    samples = node.tick(pods, lambda i, cap, pod: (100.0 if pod else 70.0, False))
    agent_view = SimulatedGpus.shared(node.gpu_file)
    devs = agent_view.devices()
    first = devs[0].pids[0] if devs[0].pids else None
    assert [len(d.pids) for d in devs] == [1, 1, 0, 0]
    assert {pod_uid_for_pid(node.proc_root, d.pids[0]) for d in devs[:2]} == {UID_A}
    assert pod_uid_for_pid(node.proc_root, SYSTEM_PID) is None  # outside Kubernetes
    assert [s.draw_w for s in samples] == [100.0, 100.0, 70.0, 70.0]
    agent_view.set_limit(1, 350_000)  # the agent caps GPU 1; the twin's next tick must keep it
    node.tick(pods[1:], lambda i, cap, pod: (min(cap, 500.0), False))
    devs = agent_view.devices()
    assert devs[1].current_w == 350 and devs[1].draw_w == 350 and devs[0].pids == []
    assert first is not None and not (node.proc_root / str(first)).exists()


def test_frontend_writes_readable_segments_serves_policy_and_metrics(tmp_path: Path) -> None:
    fe = TwinFrontend("llm-agg", "llm-agg-frontend-0", tmp_path, window_s=10).start()
    try:
        reqs = synthetic_requests(seed=1, span_s=30, rate=2.0)
        t0 = 1_800_000_000.0
        fe.close_windows(t0, 2, 1.0)
        fe.serve([(t0 + r.timestamp_ms / 1000.0 / 10, r) for r in reqs[:20]], 1.0)
        files = list(fe.segment_dir.glob("*.jsonl.gz"))
        trace = read_trace(files[0]) if len(files) == 1 else None
        lines = [json.loads(x) for f in files for x in gzip.decompress(f.read_bytes()).splitlines()]
        assert len(lines) == 20 and all(int(t0 * 1000) <= x["timestamp"] for x in lines)
        assert trace is None or not trace.issues
        assert httpx.get(fe.url + "/router_policy").json()["revision"] == 0
        text = httpx.get(fe.metrics_url).text
        assert 'dynamo_frontend_requests_total{dynamo_namespace="llm-agg",pod="llm-agg-frontend-0"} 20' in text
        done = fe.close_windows(t0 + 10, 2, 1.0)
        assert done is not None and done.requests == 20
        assert done.ttft_ms_current == done.ttft_ms_default  # same (default) policy, same seed
    finally:
        fe.stop()


def test_spec_bounds_and_racks() -> None:
    assert TwinSpec(nodes=1).racks == {"rack-a": ["twin-gpu-00"]}
    assert {r: len(n) for r, n in TwinSpec(nodes=5).racks.items()} == {"rack-a": 3, "rack-b": 2}
    for bad in (0, 65):
        with pytest.raises(ValueError, match="between 1 and 64"):
            TwinSpec(nodes=bad)
    assert len(TwinSpec(nodes=64).node_names) == 64



def test_shared_proc_root_links_every_node_with_unique_pids(tmp_path: Path) -> None:
    from powerfleet.twin.gpus.nodes import pid_base

    a = NodeSim("twin-gpu-00", 2, tmp_path, first_pid=pid_base(0))
    b = NodeSim("twin-gpu-01", 2, tmp_path, first_pid=pid_base(1))
    a.tick([_pod("a", UID_A, "0")], lambda i, cap, pod: (70.0, False))
    b.tick([_pod("b", UID_B, "1")], lambda i, cap, pod: (70.0, False))
    pid_a = SimulatedGpus.shared(a.gpu_file).devices()[0].pids[0]
    pid_b = SimulatedGpus.shared(b.gpu_file).devices()[1].pids[0]
    assert pid_a != pid_b
    shared = tmp_path / "proc" / "all"
    assert pod_uid_for_pid(shared, pid_a) == UID_A and pod_uid_for_pid(shared, pid_b) == UID_B
    b.tick([], lambda i, cap, pod: (70.0, False))
    assert pod_uid_for_pid(shared, pid_b) is None and not (shared / str(pid_b)).is_symlink()


def test_a_disaggregated_frontend_scores_its_window_with_the_disaggregated_model(tmp_path: Path) -> None:
    from powerfleet.sim.disagg import Pools, replay_batches
    from powerfleet.sim.policy import RouterPolicy
    from powerfleet.sim.replay import prepare
    from powerfleet.sim.trace import TraceRequest

    fe = TwinFrontend("llm-disagg", "llm-disagg-frontend-0", tmp_path, window_s=10)
    reqs = synthetic_requests(seed=2, span_s=30, rate=2.0)[:20]
    t0 = 1_800_000_000.0
    fe.close_windows(t0, 2, 1.0, prefill=3)
    arrivals = [(t0 + r.timestamp_ms / 1000.0 / 10, r) for r in reqs]
    fe.serve(arrivals, 1.0)
    done = fe.close_windows(t0 + 10, 2, 1.0, prefill=3)
    assert done is not None and done.requests == 20
    window = [TraceRequest((t - t0) * 1000.0, r.input_length, r.output_length, r.hash_ids) for t, r in arrivals]
    arr = prepare(window, seed=fe.seed + done.window)
    want = replay_batches(arr, Pools(3, 2), RouterPolicy(), fe.seed + done.window)[0].ttft_ms.mean
    agg = replay_batches(arr, 2, RouterPolicy(), fe.seed + done.window)[0].ttft_ms.mean
    assert done.ttft_ms_current == want != agg
    # the prefill pool at its own cap: a 0.6 cap slows its prompts
    fe.serve([(t0 + 10 + r.timestamp_ms / 1000.0 / 10, r) for r in reqs], 1.0)
    capped = fe.close_windows(t0 + 20, 2, 1.0, prefill=3, prefill_cap_fraction=0.6)
    fe.serve([(t0 + 20 + r.timestamp_ms / 1000.0 / 10, r) for r in reqs], 1.0)
    full = fe.close_windows(t0 + 30, 2, 1.0, prefill=3)
    assert capped is not None and full is not None and capped.ttft_ms_current > full.ttft_ms_current
