"""Fleet scale: 1,000, 3,000 and 10,000 GPU nodes (8 GPUs each), measured (issue 36).

For each size (--sizes, default 1000,3000,10000), on a private redis-server on a free port:

(a) Reconcile: the nodes' agents are live (each one's heartbeat key and its 8-GPU enforcement
    report, written as a real agent writes them) and simulated by --workers Celery worker
    processes (one per --queues-per-worker node queues) running the real ``powerfleet.agent.reconcile`` task against a stub runtime
    (bench/load.py's counting worker). The real ``powerfleet.fleet.reconcile`` task runs
    --ticks times in this process: its wall and CPU seconds (the live-agent SCAN, the fan-out,
    its result), the seconds until every node's pass ran, the agent workers' CPU seconds, and
    Redis ``used_memory`` and keys after each tick's passes, hence what one tick leaves behind.
    Redis after an hour: the N-independent hour of bench/load.py (b), plus 240 reconcile ticks'
    residue as measured here, all of it expiring (``broker.result_expires_s``).
(b) Beat: a real ``powerfleet beat`` with every interval at 1 s (nothing consumes ``control``):
    its CPU seconds per tick sent (its work does not depend on the number of nodes).
(c) ``powerfleet status --json``: wall and CPU seconds, output bytes, with the agents' workers
    each consuming their node queues, and the N agents announced and answering inspect
    broadcasts (bench/scale_pidbox.py: one process publishing each simulated agent's reply).
(d) Flower (``powerfleet flower``): ``/api/queues/length`` and the Broker page: wall, bytes.
    ``--light-agents``: each node's consumer played on Redis with its own connection instead
    (bench/scale_consumers.py: BRPOP with kombu's 1 s timeout, its unacked bookkeeping and ack),
    as a real agent consumes one queue; also Redis's and the consumers' idle CPU per second.
(s) The reconcile tick's send side alone, in this process (bench/scale_send.py): CPU per tick.
(r) The budget tick's reads alone (``tick_limits``), twice, on (e)'s world: wall, CPU, calls, bytes, peak RSS.
(e) Budget (bench/scale_budget.py): 1,000 deployments over the N nodes' 8 N GPU pods on the
    loopback API server: the tick's reads (API calls, bytes, wall, CPU) and the batched
    evaluations of a scaling tick (calls per deployment, wall).

Wall times depend on what else runs (the load average is printed beside them); CPU seconds are
the figure that holds on a shared machine. Progress goes to stderr.

    .venv/bin/python bench/scale.py [--sizes 1000,3000,10000] [--queues-per-worker 250] [--ticks 3]
                                    [--parts a,b,c,d,e] [--light-agents [--consumer-procs 2]] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.load import EXPIRED, PER_NODE, _wait, key_kind  # noqa: E402
from bench.procstat import process_state, proc_cpu_s, tree_cpu_s  # noqa: E402
from bench.scale_probes import beat_cost, flower_cost, free_port, loadavg, say, status_cost  # noqa: E402

HOUR_TICKS = 3600 // 15  # reconcile ticks in an hour at the default interval





def seed_agents(r: Any, nodes: list[str], interval_s: float = 15.0) -> None:
    """What N live agents keep in Redis: the heartbeat (agent/presence.py) and the node's
    enforcement report of 8 GPUs (the fields agent/evidence.py writes), both expiring."""
    from powerfleet.agent.evidence import evidence_key
    from powerfleet.agent.presence import SEEN_KEY, heartbeat_key, heartbeat_ttl_s

    now = time.time()
    pipe = r.pipeline(transaction=False)
    for i, n in enumerate(nodes):
        pipe.set(heartbeat_key(n), f"{now:.3f}", ex=heartbeat_ttl_s(interval_s))
        pipe.hset(SEEN_KEY, n, f"{now:.3f}")
        fields = {f"GPU-{i:05d}-{g}": json.dumps({
            "node": n, "gpu": g, "uuid": f"GPU-{i:05d}-{g}", "pods": [{"uid": f"uid-{i}-{g}", "name": f"pod-{i}-{g}"}],
            "decision": "agreed", "requested_w": 350, "target_w": 350, "enforced_w": 350, "current_w": 350,
            "draw_w": 301.5, "min_w": 100, "max_w": 700, "write": "unchanged", "readback": "match", "revision": 3,
            "error": None, "observed_at": now, "pod_uid": f"uid-{i}-{g}", "at": now}, sort_keys=True)
            for g in range(8)}
        pipe.hset(evidence_key(n), mapping=fields)
        pipe.expire(evidence_key(n), 45)
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()


PER_NODE_KINDS = ("powerfleet:agent:alive:", "powerfleet:enforcement:", "powerfleet:worker:")


def census_kind(key: str) -> str:
    """bench/load.py's kinds, with one kind for each per-node (or per-worker) key family."""
    return next((f"{p}*" for p in PER_NODE_KINDS if key.startswith(p)), None) or key_kind(key)


def redis_census(r: Any) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    no_ttl: dict[str, int] = {}
    for raw in r.scan_iter(count=1000):
        key = raw.decode()
        if key.startswith("bench:"):
            continue
        kind = census_kind(key)
        kinds[kind] = kinds.get(kind, 0) + 1
        if r.ttl(raw) < 0:
            no_ttl[kind] = no_ttl.get(kind, 0) + 1
    return {"used_memory": int(r.info("memory")["used_memory"]), "keys": int(r.dbsize()),
            "keys_by_kind": kinds, "keys_without_ttl": no_ttl}


def _all_running(pids: list[int]) -> bool:
    """True while every agent-simulating process runs; one that died stops the bench at once."""
    for pid in pids:
        if process_state(pid) in ("Z", "X", "gone"):
            raise SystemExit(f"bench: agent-simulating process {pid} died (its log is in the bench's temporary directory)")
    return True


def reconcile_ticks(app: Any, r: Any, nodes: list[str], pids: list[int], ctl: int, ticks: int,
                    redis_pid: int) -> dict[str, Any]:
    """``ticks`` real reconcile ticks, each run by the control worker ``ctl`` (its result stored)."""
    out: list[dict[str, Any]] = []
    mem = [int(r.info("memory")["used_memory"])]
    for k in range(ticks):
        r.delete(PER_NODE, EXPIRED)
        seed_agents(r, nodes)  # each agent beats once an interval: these are the ones the tick finds live
        cpu_w, cpu_r = [proc_cpu_s(p) for p in pids], proc_cpu_s(redis_pid)
        w0, c0 = time.perf_counter(), tree_cpu_s(ctl)
        sent = app.send_task("powerfleet.fleet.reconcile", kwargs={})
        try:
            result = sent.get(timeout=600)
        except Exception as exc:  # noqa: BLE001 - e.g. the control soft limit on a starved worker: a figure
            out.append({"failed": f"{type(exc).__name__}", "tick_wall_s": time.perf_counter() - w0,
                        "tick_cpu_s": tree_cpu_s(ctl) - c0, "redis_cpu_s": proc_cpu_s(redis_pid) - cpu_r,
                        "load": loadavg()})
            say(f"  tick {k + 1}/{ticks}: {type(exc).__name__} after {out[-1]['tick_wall_s']:.1f} s "
                f"({out[-1]['tick_cpu_s']:.2f} CPU s), load {loadavg()}")
            continue
        tick_wall, tick_cpu = time.perf_counter() - w0, tree_cpu_s(ctl) - c0
        if len(result.get("dispatched", [])) != len(nodes) and result.get("count") != len(nodes):
            raise SystemExit(f"bench: the reconcile tick did not reach every node: {str(result)[:300]}")
        if pids:
            _wait(lambda: _all_running(pids) and r.hlen(PER_NODE) + r.hlen(EXPIRED) >= len(nodes),
                  "every node's pass (run or expired)", 900)
        else:  # --no-passes: the messages are dropped, as a consumer would take them
            with r.pipeline(transaction=False) as p:
                for node in nodes:
                    p.delete(f"node.{node}")
                p.execute()
        all_ran = time.perf_counter() - w0 if pids else float("nan")
        counts = [int(v) for v in r.hvals(PER_NODE)] or [0]
        expired = int(r.hlen(EXPIRED))
        mem.append(int(r.info("memory")["used_memory"]))
        result_bytes = len(json.dumps(result))
        stored = int(r.memory_usage(f"celery-task-meta-{sent.id}") or 0)  # kept for broker.result_expires_s
        out.append({"tick_wall_s": tick_wall, "tick_cpu_s": tick_cpu, "all_passes_ran_s": all_ran,
                    "agents_cpu_s": sum(proc_cpu_s(p) for p in pids) - sum(cpu_w),
                    "redis_cpu_s": proc_cpu_s(redis_pid) - cpu_r,
                    "passes_min": min(counts), "passes_max": max(counts), "passes": sum(counts), "expired": expired,
                    "result_bytes": result_bytes, "result_redis_bytes": stored, "load": loadavg()})
        say(f"  tick {k + 1}/{ticks}: sent in {tick_wall:.2f} s ({tick_cpu:.2f} CPU s), {sum(counts)} passes ran, "
            f"{expired} expired, within {all_ran:.1f} s; result {stored} bytes in Redis, load {loadavg()}")
    # What a tick leaves behind: its stored result (the tick log is capped, the passes store none).
    # used_memory's own deltas are allocator noise at this size; MEMORY USAGE of the key is not.
    per_tick = max((t["result_redis_bytes"] for t in out if "failed" not in t), default=0)
    return {"ticks": out, "used_memory": mem, "result_per_tick": per_tick,
            "result_expires_s": app.fleet_config.broker.result_expires_s}


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:  # the child keeps its own copy of the handle
        return subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)


def fleet_size(n: int, a: argparse.Namespace) -> dict[str, Any]:
    import redis

    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.config import load_config
    from powerfleet.workers.app import create_app

    nodes = [f"n{i:05d}" for i in range(n)]
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
    out: dict[str, Any] = {"nodes": n, "gpus": 8 * n, "load_start": loadavg()}
    with EmbeddedRedis() as server:
        app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": server.url}))
        r = redis.Redis.from_url(server.url)
        out["redis_empty"] = int(r.info("memory")["used_memory"])
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "POWERFLEET_BROKER__URL": server.url}
        if "b" in a.parts:
            say(f"{n} nodes: beat, {a.beat_s:g} s at 1 s intervals")
            out["beat"] = beat_cost(server.url, a.beat_s, tmp)
        if not set("acd") & set(a.parts):
            return out
        # Each simulating process consumes `share` queues: kombu re-sends BRPOP with all of them after
        # every message, so its cost per pass grows with `share` (a real agent consumes one queue).
        # --light-agents: one connection per node queue instead (bench/scale_consumers.py).
        light = a.light_agents and a.passes
        workers = (a.consumer_procs if light else max(1, -(-n // a.queues_per_worker))) if a.passes else 0
        share = -(-n // workers) if workers else 0
        out["agent_workers"], out["queues_per_worker"], out["light_agents"] = workers, share, light
        if light:
            r.config_set("maxclients", n + 1000)  # one connection per node, and the fleet's own
            out["redis_maxclients"] = int(r.config_get("maxclients")["maxclients"])
            procs = [spawn([sys.executable, str(ROOT / "bench" / "scale_consumers.py"), server.url,
                            ",".join(nodes[w * share:(w + 1) * share])], env, tmp / f"consumers{w}.log")
                     for w in range(workers)]
        else:
            procs = [spawn([sys.executable, str(ROOT / "bench" / "load.py"), "--_worker", server.url,
                            f"agents{w}@scale", ",".join(nodes[w * share:(w + 1) * share])], env, tmp / f"agents{w}.log")
                     for w in range(workers)]
        procs.append(spawn([sys.executable, "-m", "powerfleet.cli", "worker", "-Q", "control", "-n", "ctl@scale",
                            "-c", "1", "-l", "WARNING"], env, tmp / "ctl.log"))
        # N agents' answers to inspect broadcasts and their announcements (bench/scale_pidbox.py)
        replies = spawn([sys.executable, str(ROOT / "bench" / "scale_pidbox.py"), server.url, ",".join(nodes)],
                        env, tmp / "pidbox.log")
        try:
            t0 = time.perf_counter()
            say(f"{n} nodes: starting {workers} agent workers ({share} queues each), {n} agents' control replies")
            for w in ([] if light else [f"agents{i}@scale" for i in range(workers)]) + ["ctl@scale"]:
                _wait(lambda w=w: app.control.ping(destination=[w], timeout=1.0), w, 900)
            for i in range(workers if light else 0):
                _wait(lambda i=i: "consuming" in (tmp / f"consumers{i}.log").read_text(), f"consumers{i}", 900)
            out["workers_ready_s"] = time.perf_counter() - t0
            if light:  # every consumer's BRPOP times out each second and is sent again: Redis's idle cost
                pid = server._proc.pid  # type: ignore[union-attr]
                c0, k0, w0 = proc_cpu_s(pid), sum(proc_cpu_s(p.pid) for p in procs[:-1]), time.perf_counter()
                time.sleep(10.0)  # a measuring window, not a synchronisation
                span = time.perf_counter() - w0
                out["redis_idle_cpu_per_s"] = (proc_cpu_s(pid) - c0) / span
                out["consumers_idle_cpu_per_s"] = (sum(proc_cpu_s(p.pid) for p in procs[:-1]) - k0) / span
                say(f"{n} nodes idle: Redis {out['redis_idle_cpu_per_s']:.3f} CPU s/s, "
                    f"consumers {out['consumers_idle_cpu_per_s']:.3f} CPU s/s, load {loadavg()}")
            seed_agents(r, nodes)
            out["agent_workers_start_cpu_s"] = sum(proc_cpu_s(p.pid) for p in procs[:-1])
            out["redis_agents"] = redis_census(r)
            if "a" in a.parts:
                say(f"{n} nodes: {a.ticks} reconcile ticks")
                out["reconcile"] = reconcile_ticks(app, r, nodes, [p.pid for p in procs[:-1]], procs[-1].pid, a.ticks,
                                                   server._proc.pid)  # type: ignore[union-attr]
                out["redis_after_ticks"] = redis_census(r)
            if "c" in a.parts:
                say(f"{n} nodes: status")
                out["status"] = status_cost(server.url, tmp)
            if "d" in a.parts:
                say(f"{n} nodes: flower")
                out["flower"] = flower_cost(server.url, tmp)
        finally:
            for p in [*procs, replies]:
                p.terminate()
            for p in [*procs, replies]:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()  # a worker still in its warm shutdown on a loaded machine
                    p.wait(30)
    out["load_end"] = loadavg()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Parts: a reconcile + Redis, b beat, c status, d flower, e budget, r the budget tick's reads alone, s the tick's send side alone.")
    ap.add_argument("--sizes", default="1000,3000,10000", help="node counts, comma-separated (8 GPUs each)")
    ap.add_argument("--queues-per-worker", type=int, default=250,
                    help="node queues per agent-simulating worker process (1,000 nodes: 4 processes)")
    ap.add_argument("--ticks", type=int, default=3, help="reconcile ticks per size")
    ap.add_argument("--beat-s", type=float, default=20.0, help="seconds beat runs at 1 s intervals")
    ap.add_argument("--deployments", type=int, default=1000, help="deployments for the budget part")
    ap.add_argument("--parts", default="abcde", help="which parts to run (letters)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--light-agents", action="store_true",
                    help="play each node's consumer on Redis with one connection per node (bench/scale_consumers.py) "
                         "instead of Celery workers holding --queues-per-worker queues each (part a)")
    ap.add_argument("--consumer-procs", type=int, default=2, help="processes the --light-agents are split over")
    ap.add_argument("--no-passes", dest="passes", action="store_false",
                    help="no agent-simulating workers: the tick's send side, status and Flower only")
    ap.add_argument("--out", type=Path, help="also write each size's figures to OUT/<nodes>.json as it completes")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its processes
    results = []
    for n in (int(x) for x in a.sizes.split(",")):
        got = fleet_size(n, a)
        if "s" in a.parts:
            from bench.scale_send import send_ticks

            say(f"{n} nodes: the reconcile tick's send side alone, in this process")
            got["send"] = send_ticks(n, a.ticks, say)
        if "r" in a.parts:
            from bench.scale_budget import tick_reads

            say(f"{n} nodes: the budget tick's reads alone over {8 * n} GPU pods")
            got["budget_reads"] = tick_reads(n, a.deployments, say)
        if "e" in a.parts:
            from bench.scale_budget import budget_size

            say(f"{n} nodes: budget tick over {8 * n} GPU pods, {a.deployments} deployments")
            got["budget"] = budget_size(n, a.deployments, say)
        results.append(got)
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / f"{n}.json").write_text(json.dumps(got, indent=2))
    if a.json:
        print(json.dumps({"schema": "powerfleet.bench.scale/v1", "sizes": results}, indent=2))
        return
    from bench.scale_report import report

    report(results)


if __name__ == "__main__":
    main()
