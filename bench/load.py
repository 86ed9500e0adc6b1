"""Fleet load: (a) one reconcile fan-out to 1,000 node queues runs every node's pass exactly once;
(b) Redis memory stays bounded over an hour of simulated ticks; (c) 10 deployments retuning at
once with 4 sweep workers.

(a) --nodes node queues (default 1,000), the agents simulated by --workers Celery worker
    processes running the real ``powerfleet.agent.reconcile`` task against a stub runtime
    (bench/agent.py's ``stub_worker``, reused; its section (b) times the same fan-out). Here each
    pass is also counted per node (HINCRBY), so the figure is "every node exactly once":
    passes per node min/max, total, queues left non-empty, and the seconds until the last pass.
(b) A real control worker reading a clock file, and the three tick families sent at their
    default intervals (reconcile 15 s, budget 30 s, retune 10 s) through one simulated hour
    (--hours) of clock-file time: each reconcile tick fans out to --mem-nodes of the simulated
    agents; retune runs for two deployments on the loopback API server with loopback frontends
    (no traffic: every window is launched and decided "no-traffic"). Printed: Redis
    ``used_memory`` every simulated 10 minutes, the keys by kind, and the keys without a TTL
    (these must not grow with time; everything else expires: results after
    ``broker.result_expires_s``, launch marks after 7 days, tick origins are capped at 200).

(c) --deployments (default 10) retune-enabled deployments on the loopback API server, two
    loopback frontends each, --requests recorded requests each in the same window; one control
    worker and --sweep-workers (default 4) sweep workers of one process each. One tick launches
    every deployment's window (probe + 2 shards over a 4-point grid each); printed: the seconds
    from that tick until every window is decided, the outcomes, and the shards each worker ran.

    .venv/bin/python bench/load.py [--nodes 1000] [--workers 4] [--mem-nodes 50] [--hours 1]
                                   [--deployments 10] [--sweep-workers 4] [--requests 2000]
                                   [--only a|b|c] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

PER_NODE = "bench:load:passes"
EXPIRED = "bench:load:expired"  # passes dropped unrun: they waited past their expiry (one tick interval)
AGENT_BENCH = "bench:agent:passes"  # bench/agent.py's stub worker also SADDs every node here


def counting_worker(broker: str, name: str, nodes: list[str]) -> None:
    """bench/agent.py's stub worker, plus a per-node pass counter."""
    import redis
    from celery import signals

    from bench.agent import stub_worker

    r = redis.Redis.from_url(broker)

    def count(sender: Any = None, kwargs: Any = None, **_: Any) -> None:
        r.hincrby(PER_NODE, (kwargs or {}).get("node", "?"), 1)

    def dropped(request: Any = None, expired: bool = False, **_: Any) -> None:
        if expired:
            r.hincrby(EXPIRED, (getattr(request, "kwargs", None) or {}).get("node", "?"), 1)

    signals.task_postrun.connect(count, weak=False)
    signals.task_revoked.connect(dropped, weak=False)
    stub_worker(broker, name, nodes)


def _wait(probe: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.01)


def fan_out_once(app: Any, r: Any, nodes: list[str]) -> dict[str, Any]:
    from powerfleet.tasks.fleet import fan_out

    r.delete(PER_NODE, AGENT_BENCH)
    t0 = time.perf_counter()
    fan_out(app, nodes, expires=15)
    sent = time.perf_counter() - t0
    _wait(lambda: r.hlen(PER_NODE) >= len(nodes), "every node's pass", 600)
    all_ran = time.perf_counter() - t0
    _wait(lambda: all(r.llen(f"node.{n}") == 0 for n in nodes), "the node queues to drain", 120)
    counts = [int(v) for v in r.hgetall(PER_NODE).values()]
    return {"nodes": len(nodes), "send_s": sent, "all_passes_ran_s": all_ran, "passes_total": sum(counts),
            "passes_min": min(counts), "passes_max": max(counts),
            "queues_left": sum(1 for n in nodes if r.llen(f"node.{n}"))}


def key_kind(key: str) -> str:
    if key.startswith("celery-task-meta-"):
        return "task results"
    if key.startswith("node.") or key in ("control", "sweep"):
        return f"queue {key}"
    if key.startswith("_kombu.binding"):
        return "kombu bindings (one per queue)"
    if key.startswith("powerfleet:retune:launched:"):
        return "retune launch marks"
    parts = key.split(":")
    return ":".join(parts[:3]) if key.startswith("powerfleet:") else parts[0]


def memory_hour(r: Any, url: str, nodes: list[str], hours: float, logs: Path) -> dict[str, Any]:
    import yaml

    from powerfleet.clock import FileClock
    from powerfleet.config import load_config
    from powerfleet.testing.retune_world import GRID, World
    from powerfleet.twin.apiserver import ApiServer
    from powerfleet.workers.app import create_app
    from powerfleet.workers.launcher import Launcher

    tmp = Path(tempfile.mkdtemp(prefix="bench-load-b-"))
    start = 1_800_000_000.0
    clock = FileClock(str(tmp / "now"))
    clock.set(start)
    with ApiServer() as api:
        (tmp / "traces").mkdir()
        world = World(api, tmp / "traces", api.write_kubeconfig(tmp / "kubeconfig"))
        for d in ("llama", "mistral"):
            world.add_deployment(d)
        cfg = {"broker": {"url": url}, "clock_file": clock.path, "nodes": nodes,
               "retune": {"deployments": ["llama", "mistral"], "window_interval_s": 60, "grid": GRID,
                          "trace_dir": str(world.trace_dir), "kubeconfig": str(world.kubeconfig),
                          "time_budget_s": 50, "shard_timeout_s": 40}}
        (tmp / "fleet.yaml").write_text(yaml.safe_dump(cfg))
        config = load_config(tmp / "fleet.yaml", environ={})
        app = create_app(config)
        every = {"powerfleet.fleet.reconcile": 15, "powerfleet.budget.tick": 30, "powerfleet.retune.tick": 10}
        samples: list[dict[str, Any]] = []
        try:
            with Launcher(log_dir=logs, env={"POWERFLEET_CONFIG": str(tmp / "fleet.yaml")}) as launcher:
                launcher.spawn("ctl", "worker", "--queues", "control", "--name", "ctl@load")
                _wait(lambda: app.control.ping(destination=["ctl@load"], timeout=0.5), "the control worker", 120)
                r.delete(PER_NODE)
                base = int(r.info("memory")["used_memory"])
                t0 = time.perf_counter()
                ticks = 0
                for s in range(0, int(hours * 3600) + 1, 5):
                    clock.set(start + s)
                    for task, interval in every.items():
                        if s % interval == 0:
                            app.send_task(task, kwargs={}).get(timeout=120)
                            ticks += 1
                    if s % 600 == 0:
                        _wait(lambda: all(r.llen(f"node.{n}") == 0 for n in nodes), "node queues to drain", 300)
                        samples.append({"sim_min": s // 60, "used_memory": int(r.info("memory")["used_memory"]),
                                        "keys": int(r.dbsize())})
                wall = time.perf_counter() - t0
        finally:
            world.stop()
    kinds: Counter[str] = Counter()
    no_ttl: Counter[str] = Counter()
    max_result_ttl = 0
    for raw in r.scan_iter(count=1000):
        key = raw.decode()
        if key.startswith("bench:"):
            continue
        kind = key_kind(key)
        kinds[kind] += 1
        ttl = r.ttl(raw)
        if ttl < 0:
            no_ttl[kind] += 1
        elif kind == "task results":
            max_result_ttl = max(max_result_ttl, ttl)
    return {"ticks": ticks, "wall_s": wall, "base_used_memory": base, "samples": samples, "keys_by_kind": dict(kinds),
            "keys_without_ttl": dict(no_ttl), "max_result_ttl_s": max_result_ttl,
            "result_expires_s": config.broker.result_expires_s, "passes": int(sum(int(v) for v in r.hvals(PER_NODE)))}


def retune_many(n_dgd: int, n_sweep: int, requests: int) -> dict[str, Any]:
    import redis
    import yaml

    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.config import load_config
    from powerfleet.retune.fanin import FanIn
    from powerfleet.retune.leadership import STATE_ANNOTATION, state_lease_name
    from powerfleet.retune.state import parse_state
    from powerfleet.testing.retune_world import (
        BASE_K,
        GRID,
        World,
        start_of,
        traffic_lines,
        write_segments,
    )
    from powerfleet.twin.apiserver import ApiServer
    from powerfleet.workers.app import create_app
    from powerfleet.workers.launcher import Launcher

    tmp = Path(tempfile.mkdtemp(prefix="bench-load-c-"))
    names = [f"dgd{i:02d}" for i in range(n_dgd)]
    k = BASE_K + 1
    with EmbeddedRedis() as server, ApiServer() as api:
        (tmp / "traces").mkdir()
        world = World(api, tmp / "traces", api.write_kubeconfig(tmp / "kubeconfig"))
        try:
            for i, d in enumerate(names):
                fes = world.add_deployment(d)
                write_segments(world.trace_dir, d, sorted(fes), traffic_lines(requests, start_of(k), seed=i + 1))
            cfg = {"broker": {"url": server.url},
                   "retune": {"deployments": names, "window_interval_s": 60, "grid": GRID, "objective": "ttft",
                              "trace_dir": str(world.trace_dir), "kubeconfig": str(world.kubeconfig),
                              "max_shards": 2, "time_budget_s": 55, "shard_timeout_s": 45,
                              "min_improvement_percentage": 0.0}}
            (tmp / "fleet.yaml").write_text(yaml.safe_dump(cfg))
            app = create_app(load_config(tmp / "fleet.yaml", environ={}))
            kube = KubeCluster.from_kubeconfig(str(world.kubeconfig))

            def decided() -> dict[str, str]:
                out = {}
                for d in names:
                    st = parse_state(kube.get_lease("default", state_lease_name(d)).annotations.get(STATE_ANNOTATION))
                    if st is not None and st.last_window == k:
                        out[d] = st.history[-1].outcome
                return out

            with Launcher(log_dir=tmp / "logs", env={"POWERFLEET_CONFIG": str(tmp / "fleet.yaml")}) as launcher:
                workers = ["ctl@load"] + [f"sweep{i}@load" for i in range(n_sweep)]
                launcher.spawn("ctl", "worker", "-Q", "control", "-n", workers[0], "-c", "2", "-l", "WARNING")
                for i in range(n_sweep):
                    launcher.spawn(f"sweep{i}", "worker", "-Q", "sweep", "-n", workers[i + 1], "-l", "WARNING")
                for w in workers:
                    _wait(lambda w=w: app.control.ping(destination=[w], timeout=0.5), w, 180)
                app.send_task("powerfleet.retune.tick", kwargs={"now": start_of(k - 1) + 1}).get(timeout=120)  # enable
                t0 = time.perf_counter()
                tick = app.send_task("powerfleet.retune.tick", kwargs={"now": start_of(k + 1) + 1}).get(timeout=120)
                launched = len(tick["launched"])
                _wait(lambda: len(decided()) == n_dgd, "every window decided", 600)
                wall = time.perf_counter() - t0
                outcomes = Counter(decided().values())
                fan = FanIn(redis.Redis.from_url(server.url))
                hosts: Counter[str] = Counter()
                for key in fan.r.scan_iter("powerfleet:retune:result:*"):  # host is "<host>:<pid>"
                    res = json.loads(fan.r.get(key) or b"{}")
                    hosts[str(res.get("host", "?"))] += 1
            kube.close()
        finally:
            world.stop()
    return {"deployments": n_dgd, "sweep_workers": n_sweep, "requests_each": requests, "launched": launched,
            "all_decided_s": wall, "outcomes": dict(outcomes), "shards_per_process": sorted(hosts.values())}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_worker":
        counting_worker(sys.argv[2], sys.argv[3], sys.argv[4].split(","))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--mem-nodes", type=int, default=50)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--deployments", type=int, default=10)
    ap.add_argument("--sweep-workers", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--only", choices=["a", "b", "c"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out: dict[str, Any] = {}
    if a.only in (None, "a", "b"):
        out.update(fan_out_and_memory(a))
    if a.only in (None, "c"):
        out["retune"] = retune_many(a.deployments, a.sweep_workers, a.requests)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    report(a, out)


def fan_out_and_memory(a: argparse.Namespace) -> dict[str, Any]:
    import redis

    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.config import load_config
    from powerfleet.workers.app import create_app

    nodes = [f"n{i:04d}" for i in range(a.nodes)]
    logs = Path(tempfile.mkdtemp(prefix="bench-load-"))
    out: dict[str, Any] = {}
    with EmbeddedRedis() as server:
        app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": server.url}))
        r = redis.Redis.from_url(server.url)
        share = (a.nodes + a.workers - 1) // a.workers
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"}
        procs = []
        for w in range(a.workers):
            part = nodes[w * share:(w + 1) * share]
            with open(logs / f"agents{w}.log", "wb") as log:  # the child keeps its own copy of the handle
                procs.append(subprocess.Popen([sys.executable, __file__, "--_worker", server.url, f"agents{w}@load",
                                               ",".join(part)], env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            for w in range(a.workers):
                _wait(lambda w=w: app.control.ping(destination=[f"agents{w}@load"], timeout=0.5), f"worker {w}", 180)
            if a.only in (None, "a"):
                out["fanout"] = fan_out_once(app, r, nodes)
            if a.only in (None, "b"):
                out["memory"] = memory_hour(r, server.url, nodes[:a.mem_nodes], a.hours, logs)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
    return out


def report(a: argparse.Namespace, out: dict[str, Any]) -> None:
    if "fanout" in out:
        print_fanout(a, out["fanout"])
    if "memory" in out:
        print_memory(a, out["memory"])
    if "retune" in out:
        c = out["retune"]
        print(f"(c) {c['deployments']} deployments retuning at once ({c['requests_each']} requests each), "
              f"{c['sweep_workers']} sweep workers: {c['launched']} windows launched by one tick, all decided "
              f"{c['all_decided_s']:.1f} s later; outcomes {c['outcomes']}; shards per sweep process "
              f"{c['shards_per_process']}")


def print_fanout(a: argparse.Namespace, f: dict[str, Any]) -> None:
    print(f"(a) one fan-out to {f['nodes']} node queues, {a.workers} agent-simulating worker processes: "
          f"sent in {f['send_s']:.2f} s, every pass ran within {f['all_passes_ran_s']:.1f} s; "
          f"passes per node min {f['passes_min']} max {f['passes_max']} (total {f['passes_total']}), "
          f"queues left non-empty: {f['queues_left']}")


def print_memory(a: argparse.Namespace, m: dict[str, Any]) -> None:
    print(f"(b) {m['ticks']} ticks over {a.hours:g} simulated hour(s) in {m['wall_s']:.0f} s wall, "
          f"{a.mem_nodes} nodes per reconcile fan-out ({m['passes']} agent passes):")
    print(f"    used_memory before the hour: {m['base_used_memory'] / 1e6:.2f} MB")
    for s in m["samples"]:
        print(f"    sim {s['sim_min']:>3} min: used_memory {s['used_memory'] / 1e6:.2f} MB, {s['keys']} keys")
    print(f"    keys by kind: {m['keys_by_kind']}")
    print(f"    keys without a TTL: {m['keys_without_ttl']}; task results expire within "
          f"{m['max_result_ttl_s']} s (result_expires_s {m['result_expires_s']})")


if __name__ == "__main__":
    main()
