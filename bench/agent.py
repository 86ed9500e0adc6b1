"""Node agent speed: (a) annotation change -> cap live, (b) a 1,000-node fan-out, (c) one pass.

(a) Seconds from an annotation change on the loopback API server to the new cap read back
    on the simulated GPU: the agent's runtime with its pod watch (the official client against
    ApiServer) and a shared simulated-GPU file, no tick at all. Median and max over --changes.
    Goal: <= 2 s (Dynamo's agent waits for its 15 s period).
(b) One reconcile fan-out to --nodes node queues (default 1,000): the send time of
    ``powerfleet.tasks.fleet.fan_out`` against the per-message ``send_task`` loop it replaced,
    and the time until every node's pass has run once, with the agents simulated by
    --workers Celery worker processes each consuming its share of the node queues and running
    the real ``powerfleet.agent.reconcile`` task against a stub runtime. Goal: within one 15 s tick.
    A simulation artifact to keep in mind: a worker's BRPOP names all its queues (x4 priority
    lists) on every message, so the consumer cost per message grows with the queues per process
    (500 queues: ~11 ms per message here); a real agent BRPOPs its one queue.
(c) Pass time for a node with 8 GPUs and 200 processes (25 pods of 8 processes): the first
    pass (sets 8 caps) and the steady pass (everything holds), median over --passes, and the
    time to publish that pass's enforcement evidence to a real redis-server.
(d) Seconds from a new pod's first process appearing on a GPU (its pod already annotated and
    in the watch-backed view) to its cap read back: the process poll (agent.process_poll_s
    1 s), no tick, no pod event. Median and max over --changes. Goal: <= 2 s.
(e) Kubernetes API requests the agent's pod view makes at steady state, counted over a window
    with a short server watch timeout and scaled to the default 30 s: no per-pass LIST.
(f) Seconds from an annotated pod's Ready flip (its idle GPU just allocated through the twin's
    PodResources server) to its cap read back: the watch event's pass only (bench/agent_ready.py).

    .venv/bin/python bench/agent.py [--changes 20] [--nodes 1000] [--workers 8] [--passes 200] [--json]
    .venv/bin/python bench/agent.py --only a|b|c|d|e|f
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from prometheus_client import CollectorRegistry  # noqa: E402

from powerfleet.agent.metrics import AgentMetrics  # noqa: E402
from powerfleet.agent.podcache import WATCH_MIN_S  # noqa: E402
from powerfleet.agent.reconcile import NodeAgent  # noqa: E402
from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry  # noqa: E402
from powerfleet.agent.state import StateStore  # noqa: E402
from powerfleet.clock import SystemClock  # noqa: E402
from powerfleet.cluster.dgd import POWER_ANNOTATION  # noqa: E402
from powerfleet.cluster.objects import PodInfo  # noqa: E402

PASSES_KEY = "bench:agent:passes"


def gpu(i: int, pids: list[int]) -> dict[str, Any]:
    return {"index": i, "uuid": f"GPU-{i:04d}", "min_w": 200, "max_w": 700, "default_w": 700, "pids": pids}


# -- (a) ---------------------------------------------------------------------------------------

def bench_watch(changes: int) -> dict[str, float]:
    from powerfleet.agent.podcache import PodCache
    from powerfleet.agent.runtime import AgentRuntime
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.twin.apiserver import ApiServer

    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-a-"))
    uid = str(uuid.uuid4())
    write_proc_entry(tmp / "proc", 4242, uid)
    gpus = SimulatedGpus.shared(tmp / "gpus.json", [gpu(0, [4242])])

    def pod(cap: int) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "decode-0", "namespace": "llm", "uid": uid, "annotations": {POWER_ANNOTATION: str(cap)}},
                "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "image": "m"}]},
                "status": {"phase": "Running"}}

    lat: list[float] = []
    with ApiServer() as api:
        api.apply(pod(300))
        cluster = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp / "kubeconfig")))
        kicks: list[Any] = []
        cache = PodCache(cluster, "gpu-0", ["llm"], lambda reason: [k(reason) for k in kicks])
        agent = NodeAgent("gpu-0", open_gpus=lambda: SimulatedGpus.shared(tmp / "gpus.json"),
                          list_pods=cache.snapshot, proc_root=tmp / "proc", complete_view=False,
                          state=StateStore(tmp / "state"), clock=SystemClock(), safe_default_watts=500,
                          metrics=AgentMetrics(CollectorRegistry()))
        rt = AgentRuntime(agent, interval_s=3600)  # no tick and no timer pass within the run
        kicks.append(rt.request_pass)
        rt.stoppers.append(cache.start().stop)
        rt.start()
        _wait(lambda: gpus.read_limit(0) == 300_000, 30)
        for k in range(changes):
            cap = 250 + 10 * (k % 20) + (5 if k % 2 else 0)
            t0 = time.perf_counter()
            api.apply(pod(cap))
            _wait(lambda c=cap: gpus.read_limit(0) == c * 1000, 30)
            lat.append(time.perf_counter() - t0)
        rt.stop()
        cluster.close()
    return {"median_s": statistics.median(lat), "max_s": max(lat), "changes": len(lat)}


def _wait(probe, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit("bench: timed out")
        time.sleep(0.002)


# -- (b) ---------------------------------------------------------------------------------------

def stub_worker(broker: str, name: str, nodes: list[str]) -> None:
    """A Celery worker standing in for many agents: the real task, a stub runtime serving every node."""
    import redis
    from celery import signals

    from powerfleet.agent import runtime as agent_runtime
    from powerfleet.agent.reconcile import PassReport
    from powerfleet.config import load_config
    from powerfleet.workers.app import create_app

    app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": broker}))
    r = redis.Redis.from_url(broker)

    class Stub:
        node = "*"
        metrics = AgentMetrics(CollectorRegistry())

        def serves(self, node: str) -> bool:
            return True

        def tick_pass(self) -> PassReport:
            return PassReport(node="*", trigger="tick", dry_run=False, at=time.time(), duration_s=0.0)

    agent_runtime.install(Stub())  # type: ignore[arg-type]

    def done(sender: Any = None, kwargs: Any = None, **_: Any) -> None:
        r.sadd(PASSES_KEY, (kwargs or {}).get("node", "?"))

    signals.task_postrun.connect(done, weak=False)
    app.worker_main(["worker", "-Q", ",".join(f"node.{n}" for n in nodes), "-n", name, "-P", "solo",
                     "--prefetch-multiplier", "1", "--loglevel", "WARNING", "--without-mingle", "--without-gossip"])


def bench_fanout(n_nodes: int, n_workers: int) -> dict[str, float]:
    import redis

    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.config import load_config
    from powerfleet.tasks.fleet import AGENT_RECONCILE, fan_out
    from powerfleet.workers.app import create_app

    nodes = [f"n{i:04d}" for i in range(n_nodes)]
    logs = Path(tempfile.mkdtemp(prefix="bench-agent-b-"))
    with EmbeddedRedis() as server:
        app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": server.url}))
        r = redis.Redis.from_url(server.url)
        # Send side alone (no consumer yet): the loop it replaced, then the batched fan-out, twice each.
        legacy, batched = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            for node in nodes:
                app.send_task(AGENT_RECONCILE, kwargs={"node": node}, expires=15)
            legacy.append(time.perf_counter() - t0)
            r.flushall()
            t0 = time.perf_counter()
            fan_out(app, nodes, expires=15)
            batched.append(time.perf_counter() - t0)
            r.flushall()
        # End to end: workers up and idle, then one fan-out; time until every node's pass ran.
        procs = []
        share = (n_nodes + n_workers - 1) // n_workers
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"}
        for w in range(n_workers):
            part = nodes[w * share:(w + 1) * share]
            out = open(logs / f"w{w}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, __file__, "--_worker", server.url, f"stub{w}@bench",
                                           ",".join(part)], env=env, stdout=out, stderr=subprocess.STDOUT))
        try:
            for w in range(n_workers):
                deadline = time.monotonic() + 120
                while not app.control.ping(destination=[f"stub{w}@bench"], timeout=0.5):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"stub worker {w} did not start; see {logs}")
            t0 = time.perf_counter()
            fan_out(app, nodes, expires=15)
            sent = time.perf_counter() - t0
            deadline = time.monotonic() + 300
            while r.scard(PASSES_KEY) < n_nodes:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {r.scard(PASSES_KEY)} of {n_nodes} passes ran")
                time.sleep(0.01)
            all_ran = time.perf_counter() - t0
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
    return {"nodes": n_nodes, "workers": n_workers,
            "legacy_send_s": min(legacy), "legacy_ms_per_node": 1000 * min(legacy) / n_nodes,
            "fanout_send_s": min(batched), "fanout_ms_per_node": 1000 * min(batched) / n_nodes,
            "e2e_send_s": sent, "e2e_all_passes_ran_s": all_ran}


# -- (c) ---------------------------------------------------------------------------------------

def bench_pass(n_passes: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-c-"))
    pods, pid = [], 1000
    gpu_pids: list[list[int]] = [[] for _ in range(8)]
    for p in range(25):  # 25 pods x 8 processes = 200, spread over the 8 GPUs (pods share GPUs)
        uid = str(uuid.uuid4())
        pods.append(PodInfo(name=f"p{p}", namespace="llm", uid=uid, node_name="gpu-0", phase="Running",
                            annotations={POWER_ANNOTATION: "350"}))
        for k in range(8):
            write_proc_entry(tmp / "proc", pid, uid)
            gpu_pids[(p + k) % 8].append(pid)
            pid += 1
    gpus = SimulatedGpus([gpu(i, gpu_pids[i]) for i in range(8)])
    agent = NodeAgent("gpu-0", open_gpus=lambda: gpus, list_pods=lambda: pods, proc_root=tmp / "proc",
                      state=StateStore(tmp / "state"), clock=SystemClock(), safe_default_watts=500,
                      metrics=AgentMetrics(CollectorRegistry()))
    t0 = time.perf_counter()
    first = agent.run_pass()
    first_s = time.perf_counter() - t0
    assert all(g.action == "set" and g.cap_w == 350 for g in first.gpus), first
    times = []
    for _ in range(n_passes):
        t0 = time.perf_counter()
        agent.run_pass()
        times.append(time.perf_counter() - t0)
    from powerfleet.agent.evidence import EvidencePublisher
    from powerfleet.broker.embedded import EmbeddedRedis
    import redis

    with EmbeddedRedis() as server:
        pub = EvidencePublisher(redis.Redis.from_url(server.url), "gpu-0", 45)
        report = agent.run_pass()
        pubs = []
        for _ in range(50):
            t0 = time.perf_counter()
            pub.publish(report, agent.last_pods)
            pubs.append(time.perf_counter() - t0)
    return {"gpus": 8, "processes": pid - 1000, "pods": len(pods), "first_pass_ms": first_s * 1000,
            "steady_pass_median_ms": statistics.median(times) * 1000, "steady_pass_max_ms": max(times) * 1000,
            "publish_median_ms": statistics.median(pubs) * 1000}


# -- (d), (e) ----------------------------------------------------------------------------------

def _node_with_pods(tmp: Path, n: int) -> tuple[Any, list[dict[str, Any]]]:
    from powerfleet.twin.apiserver import ApiServer

    api = ApiServer().__enter__()
    pods = []
    for k in range(n):
        uid = str(uuid.uuid4())
        write_proc_entry(tmp / "proc", 5000 + k, uid)
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"decode-{k}", "namespace": "llm", "uid": uid,
                                  "annotations": {POWER_ANNOTATION: str(300 + 5 * k)}},
                     "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "image": "m"}]},
                     "status": {"phase": "Running"}})
        api.apply(pods[-1])
    return api, pods


def bench_new_process(changes: int) -> dict[str, float]:
    from powerfleet.agent.build import connect_cluster
    from powerfleet.agent.podcache import PodCache
    from powerfleet.agent.runtime import AgentRuntime
    from powerfleet.config import FleetConfig

    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-d-"))
    (tmp / "proc" / "1").mkdir(parents=True)
    api, pods = _node_with_pods(tmp, changes)
    try:
        gpus = SimulatedGpus.shared(tmp / "gpus.json", [gpu(0, [])])
        cluster, _ = connect_cluster(FleetConfig.model_validate(
            {"agent": {"kubeconfig": str(api.write_kubeconfig(tmp / "kubeconfig"))}}))
        cache = PodCache(cluster, "gpu-0", ["llm"], lambda reason: None).start()  # type: ignore[union-attr]
        agent = NodeAgent("gpu-0", open_gpus=lambda: SimulatedGpus.shared(tmp / "gpus.json"),
                          list_pods=cache.snapshot, proc_root=tmp / "proc", complete_view=False,
                          state=StateStore(tmp / "state"), clock=SystemClock(), metrics=AgentMetrics(CollectorRegistry()))
        rt = AgentRuntime(agent, interval_s=3600, poll_s=FleetConfig().agent.process_poll_s).start()
        _wait(lambda: _synced(cache), 30)
        rt.tick_pass()
        lat = []
        for k in range(changes):
            def start(devs: list[Any], pid: int = 5000 + k) -> None:
                devs[0].pids = [pid]
            t0 = time.perf_counter()
            gpus.update(start)
            _wait(lambda c=300 + 5 * k: gpus.read_limit(0) == c * 1000, 30)
            lat.append(time.perf_counter() - t0)
        rt.stop()
        cache.stop()
    finally:
        api.__exit__(None, None, None)
    return {"median_s": statistics.median(lat), "max_s": max(lat), "changes": len(lat)}


def _synced(cache: Any) -> bool:
    try:
        cache.snapshot()
        return True
    except Exception:
        return False


def bench_api_calls(window_s: float) -> dict[str, float]:
    from powerfleet.agent.build import connect_cluster
    from powerfleet.agent.podcache import PodCache
    from powerfleet.config import FleetConfig

    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-e-"))
    api, _ = _node_with_pods(tmp, 4)
    try:
        cluster, _ = connect_cluster(FleetConfig.model_validate(
            {"agent": {"kubeconfig": str(api.write_kubeconfig(tmp / "kubeconfig"))}}))
        timeout = 2
        cache = PodCache(cluster, "gpu-0", [], lambda reason: None, watch_timeout_s=timeout).start()  # type: ignore[union-attr]
        _wait(lambda: _synced(cache), 30)
        start = dict(cache.calls)
        t0 = time.monotonic()
        while time.monotonic() - t0 < window_s:
            cache.snapshot()  # what every pass reads: no request
            time.sleep(0.01)
        calls = {k: cache.calls[k] - start[k] for k in start}
        cache.stop()
    finally:
        api.__exit__(None, None, None)
    per_min = sum(calls.values()) * 60 / window_s
    return {"window_s": window_s, "lists": calls["list"], "watches": calls["watch"], "watch_timeout_s": timeout,
            "per_min_measured": per_min, "per_min_at_30s_timeout": per_min * timeout / 30,
            "per_min_at_default": per_min * timeout / (1.5 * WATCH_MIN_S)}


def _latency(what: str, d: dict[str, float], unit: str) -> None:
    print(f"{what} -> cap read back: median {d['median_s']:.3f} s, max {d['max_s']:.3f} s "
          f"over {d['changes']:.0f} {unit} (goal <= 2 s)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_worker":
        stub_worker(sys.argv[2], sys.argv[3], sys.argv[4].split(","))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--passes", type=int, default=200)
    ap.add_argument("--only", choices=["a", "b", "c", "d", "e", "f"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the agent logs every cap it sets; not the figures
    out: dict[str, Any] = {}
    if a.only in (None, "a"):
        out["watch_to_cap"] = bench_watch(a.changes)
    if a.only in (None, "b"):
        out["fanout"] = bench_fanout(a.nodes, a.workers)
    if a.only in (None, "c"):
        out["pass"] = bench_pass(a.passes)
    if a.only in (None, "d"):
        out["process_to_cap"] = bench_new_process(a.changes)
    if a.only in (None, "e"):
        out["api_calls"] = bench_api_calls(10.0)
    if a.only in (None, "f"):
        from bench.agent_ready import bench_ready
        out["ready_to_cap"] = bench_ready(a.changes)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    if "watch_to_cap" in out:
        _latency("(a) annotation change", out["watch_to_cap"], "changes")
    if "fanout" in out:
        f = out["fanout"]
        print(f"(b) fan-out to {f['nodes']} node queues: send {f['fanout_send_s']:.3f} s ({f['fanout_ms_per_node']:.3f} ms/node)"
              f" vs per-message send_task {f['legacy_send_s']:.3f} s ({f['legacy_ms_per_node']:.3f} ms/node)")
        print(f"    every node's pass ran {f['e2e_all_passes_ran_s']:.2f} s after the fan-out began "
              f"({f['workers']} worker processes; goal within one 15 s tick)")
    if "pass" in out:
        c = out["pass"]
        print(f"(c) pass, {c['gpus']} GPUs / {c['processes']} processes / {c['pods']} pods: first {c['first_pass_ms']:.1f} ms,"
              f" steady median {c['steady_pass_median_ms']:.1f} ms (max {c['steady_pass_max_ms']:.1f} ms);"
              f" evidence published in {c['publish_median_ms']:.2f} ms (median)")
    if "process_to_cap" in out:
        _latency("(d) new pod's process", out["process_to_cap"], "pods")
    if "api_calls" in out:
        e = out["api_calls"]
        print(f"(e) pod view at steady state: {e['lists']} LIST, {e['watches']} WATCH in {e['window_s']:.0f} s "
              f"(watch timeout {e['watch_timeout_s']} s) -> {e['per_min_at_30s_timeout']:.1f} requests/min at a fixed "
              f"30 s, {e['per_min_at_default']:.2f} at the default drawn in [{WATCH_MIN_S}, {2 * WATCH_MIN_S}) s; "
              "passes make none")
    if "ready_to_cap" in out:
        _latency("(f) pod Ready flip (GPU allocated, idle)", out["ready_to_cap"], "pods")


if __name__ == "__main__":
    main()
