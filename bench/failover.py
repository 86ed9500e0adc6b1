"""Broker failover, measured with real processes on loopback: redis-server as master and
replicas, three Sentinels, the fleet (beat + a control worker) on ``sentinel://`` URLs.

(a) Resume: SIGKILL the master (or ``SENTINEL FAILOVER``) while beat ticks every second;
    printed: seconds from the master's loss to the promotion, and to the first tick of each
    family (reconcile, budget, retune) that ran after it (the tick log, read from the new master).
(b) Loss: a client publishes --tasks tasks (powerfleet.agent.reconcile to a node queue nobody
    consumes, so they stay queued) at --rate per second through the fleet's own send_task, and
    the master is SIGKILLed after 40 % of them; printed: publishes acknowledged, refused (the
    caller saw an error: nothing lost, the sender knows), and acknowledged but missing from the
    promoted master's queue (lost), per 1,000 acknowledged, with min-replicas-to-write 0 and 1.
(c) Unsynced replica: the only replica restarted (empty, full resync under way) just before the
    master is killed, with min-replicas-to-write 0 and 1.
(d) As (b), but a graceful ``SENTINEL FAILOVER`` instead of the kill, the publisher following
    Sentinel's +switch-master (as every fleet process does, powerfleet.broker.follow) or not.
(e) Retune windows: a control+sweep worker retunes one deployment (loopback API server and
    frontends, a clock file the bench moves); for each of --windows windows the master is
    SIGKILLed while a shard reads the window, the killed node is restarted as a replica, and
    the clock is moved past the sweep's deadline; printed: windows that ended in exactly one
    recorded outcome (the state Lease's history), and the outcomes.
(f) Repeated losses (bench/failover_repeat.py): --kills SIGKILLs and --freezes SIGSTOPs of the master
    under beat (a leader and a standby), a control worker and two agents, one row per run: promotion,
    ticks resumed, beat single, duplicate runs, lost tasks, caps kept (--table: as Markdown).

(a), (b), (c) and (e) run with min-replicas-to-write 0 and 1 (--min-replicas: only one); (e) with
Sentinel's internal periods shortened as in the tests (powerfleet/testing/sentinels.py).

    .venv/bin/python bench/failover.py [--tasks 1000] [--rate 400] [--down-after-ms 800]
                                       [--only a|b|c|d|e|f] [--repeat 1] [--windows 3]
                                       [--kills 10] [--freezes 5] [--min-replicas 0|1] [--json|--table]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from powerfleet.beat.ticklog import TickLog  # noqa: E402
from powerfleet.broker.clients import redis_client  # noqa: E402
from powerfleet.broker.follow import follow_switches  # noqa: E402
from powerfleet.clock import FileClock  # noqa: E402
from powerfleet.cluster.kube import KubeCluster  # noqa: E402
from powerfleet.config import load_config  # noqa: E402
from powerfleet.retune.fanin import FanIn  # noqa: E402
from powerfleet.testing.failover import RETUNE_BUDGET_S, retune_config, state_of  # noqa: E402
from powerfleet.testing.retune_world import BASE_K, World, start_of, traffic_lines, write_segments  # noqa: E402
from powerfleet.testing.sentinels import SentinelCluster  # noqa: E402
from powerfleet.testing.waiting import wait_for, wait_worker  # noqa: E402
from powerfleet.twin.apiserver import ApiServer  # noqa: E402
from powerfleet.workers.app import TICK_FAMILIES, create_app  # noqa: E402
from powerfleet.workers.launcher import Launcher  # noqa: E402

from bench.failover_repeat import repeated, table  # noqa: E402

QUEUE_NODE = "bench-failover"


def resume(base: Path, graceful: bool, down_after_ms: int, min_replicas: int) -> dict[str, Any]:
    with SentinelCluster(base, replicas=2, down_after_ms=down_after_ms, min_replicas_to_write=min_replicas) as cluster:
        env = {**cluster.env(), "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_BEAT__BUDGET_INTERVAL_S": "1",
               "POWERFLEET_BEAT__RETUNE_INTERVAL_S": "1", "POWERFLEET_BEAT__LOCK_TIMEOUT_S": "5",
               "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "1"}
        app = create_app(load_config(environ=env))
        ticks = TickLog(redis_client(cluster.url, app.fleet_config.broker, socket_timeout=2))  # follows the master
        with Launcher(log_dir=base / "logs", env=dict(env)) as launcher:
            launcher.spawn("ctl", "worker", "--queues", "control,sweep", "--name", "ctl@bench")
            wait_worker(app, "ctl@bench", timeout_s=90)
            launcher.spawn("beat", "beat")
            wait_for(lambda: all(ticks.counts().get(f, 0) >= 2 for f in TICK_FAMILIES), "ticks", 90)
            old = cluster.master_port()
            lost_at = time.time()
            if graceful:
                cluster.graceful_failover()
            else:
                cluster.kill(old)
            new = cluster.wait_new_master(old, timeout_s=60)
            promoted = time.time() - lost_at
            # Read on the promoted master itself: in a graceful failover the old one still takes
            # writes until Sentinel demotes it, and those are dropped when it resyncs.
            on_new = TickLog(redis.Redis(host="127.0.0.1", port=new, socket_timeout=2))
            first: dict[str, float] = {}
            for family in TICK_FAMILIES:
                at = wait_for(lambda f=family: (t := on_new.last_ticks().get(f, 0)) > lost_at and t, family, 120, 0.05)
                first[family] = round(at - lost_at, 2)
            if graceful:
                cluster.wait_demoted(old, timeout_s=60)
                demoted = round(time.time() - lost_at, 2)
            alive = not launcher.dead_children()
    out = {"scenario": ("SENTINEL FAILOVER" if graceful else "SIGKILL master") + f", min-replicas-to-write {min_replicas}",
           "promoted_s": round(promoted, 2),
           "first_tick_s": first, "processes_alive": alive}
    if graceful:
        out["old_master_demoted_s"] = demoted
    return out


def loss(base: Path, tasks: int, rate: float, min_replicas: int, unsynced: bool, down_after_ms: int,
         graceful: bool = False, follow: bool = False) -> dict[str, Any]:
    replicas = 1 if unsynced else 2
    with SentinelCluster(base, replicas=replicas, down_after_ms=down_after_ms, min_replicas_to_write=min_replicas,
                         min_replicas_max_lag=10, sync_delay_s=5 if unsynced else 0) as cluster:
        env = {**cluster.env(), "POWERFLEET_BROKER__NOREPLICAS_RETRY_S": "2"}
        app = create_app(load_config(environ=env))
        if follow:  # as every fleet process does: leave the old master at Sentinel's switch
            follow_switches(cluster.url, app.fleet_config.broker)
        acked: list[str] = []
        refused = 0
        old = cluster.master_port()

        def publish() -> None:
            nonlocal refused
            stop_at = time.monotonic() + 2 * tasks / rate + 10  # a master refusing every write: bounded
            for i in range(tasks):
                if time.monotonic() > stop_at:
                    break
                t0 = time.monotonic()
                try:
                    app.send_task("powerfleet.agent.reconcile", kwargs={"node": QUEUE_NODE}, expires=3600,
                                  ignore_result=True, task_id=f"bench-{i}")
                    acked.append(f"bench-{i}")
                except Exception:  # noqa: BLE001 - the caller saw the failure: counted as refused
                    refused += 1
                time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - t0)))

        sender = threading.Thread(target=publish, daemon=True)
        sender.start()
        wait_for(lambda: len(acked) + refused >= (tasks * 0.4 if not unsynced else tasks * 0.2), "publishes", 120, 0.005)
        if unsynced:  # restart the only replica empty: it needs a full resync
            replica = cluster.redis_ports[1]
            cluster.kill(replica)
            for f in (base / f"redis-{replica}").glob("*"):
                if f.is_file():
                    f.unlink()
            for d in (base / f"redis-{replica}").glob("appendonlydir"):
                for f in d.glob("*"):
                    f.unlink()
            cluster.start_redis(replica, old)  # Redis's default 5 s delay before the full sync
            wait_for(lambda: len(acked) + refused >= tasks * 0.4, "publishes", 120, 0.005)
        killed_after = len(acked)
        if graceful:
            cluster.graceful_failover()
        else:
            cluster.kill(old)
        cluster.wait_new_master(old, timeout_s=60)
        sender.join()
        if graceful:
            cluster.wait_demoted(old, timeout_s=60)
        r = redis_client(cluster.url, app.fleet_config.broker, socket_timeout=5)
        present = set()
        for raw in r.lrange(f"node.{QUEUE_NODE}", 0, -1):
            present.add(json.loads(raw)["headers"]["id"])
        lost = [t for t in acked if t not in present]
        # Failovers the Sentinels performed (one expected; a second one replaces a master
        # that is still taking writes, which a resync then drops).
        switches = max(sum("+switch-master" in line for line in log.read_text(errors="replace").splitlines())
                       for log in base.glob("sentinel-*/sentinel.log"))
    n = max(1, len(acked))
    kind = ("SENTINEL FAILOVER, " + ("following +switch-master, " if follow else "not following, ")) if graceful else ""
    return {"scenario": kind + ("unsynced replica, " if unsynced else "") + f"min-replicas-to-write {min_replicas}",
            "attempted": len(acked) + refused, "acknowledged": len(acked), "refused": refused, "lost": len(lost),
            "lost_per_1000_acknowledged": round(1000 * len(lost) / n, 1),
            "acknowledged_before_kill": killed_after, "failovers": switches,
            "lost_range": [min((int(t.split("-")[1]) for t in lost), default=None),
                           max((int(t.split("-")[1]) for t in lost), default=None)]}


def windows(base: Path, count: int, min_replicas: int, down_after_ms: int) -> dict[str, Any]:
    # Sentinel's periods shortened as in the tests (restarting the killed node between windows
    # took Sentinel over 40 s to take in with its defaults): they change how long a failover
    # takes, not what survives it.
    with SentinelCluster(base / "redis", replicas=2, down_after_ms=down_after_ms, fast=True, failover_timeout_ms=4000,
                         min_replicas_to_write=min_replicas) as cluster, ApiServer() as api:
        (base / "traces").mkdir()
        world = World(api, base / "traces", api.write_kubeconfig(base / "kubeconfig"))
        world.add_deployment("llama")
        clock = FileClock(str(base / "now"))
        clock.set(start_of(BASE_K) + 1)
        cfg = retune_config(cluster, world, clock, base / "fleet.yaml", db=0)
        app = create_app(load_config(cfg, environ={}))
        kube = KubeCluster.from_kubeconfig(str(world.kubeconfig))
        fan = FanIn(redis_client(app.conf.broker_url, app.fleet_config.broker, socket_timeout=5))
        ended: list[dict[str, Any]] = []

        def tick() -> dict[str, Any]:
            return app.send_task("powerfleet.retune.tick", kwargs={}).get(timeout=120)

        try:
            with Launcher(log_dir=base / "logs", env={"POWERFLEET_CONFIG": str(cfg)}) as launcher:
                launcher.spawn("worker", "worker", "--queues", "control,sweep", "--name", "retune@bench",
                               "--concurrency", "3")
                wait_worker(app, "retune@bench", timeout_s=120)
                tick()  # enables retune in window BASE_K
                for i in range(count):
                    k = BASE_K + 1 + i
                    write_segments(world.trace_dir, "llama", sorted(world.frontends["llama"]),
                                   traffic_lines(4000, start_of(k), seed=k), tag=f"seg{k}")
                    clock.set(start_of(k + 1) + 1)
                    launched = tick()["launched"]
                    rec = wait_for(lambda: next(iter(fan.active("llama")), None), "the sweep record", 120)
                    reading = True
                    try:
                        wait_for(lambda: fan.readers(rec.sid), "a shard reading", 60, every_s=0.005)
                    except AssertionError:
                        reading = False  # the shards were done first: killed after the sweep
                    old = cluster.master_port()
                    cluster.kill(old)
                    cluster.wait_new_master(old, timeout_s=60)
                    cluster.restore()
                    wait_worker(app, "retune@bench", timeout_s=120)
                    clock.set(start_of(k + 1) + 1 + RETUNE_BUDGET_S + 1)
                    wait_for(lambda: tick() is not None, "a tick after the failover", 120, every_s=1)
                    state = wait_for(lambda: (s := state_of(kube)) is not None and s.last_window is not None
                                     and s.last_window >= k and s, f"window {k} ended", 180, every_s=0.5)
                    mine = [h for h in state.history if h.window == k]
                    ended.append({"window": k, "launched": launched == [{"dgd": "llama", "window": k}],
                                  "killed_while_reading": reading, "outcomes": len(mine),
                                  "pending": [p.window for p in state.pending],
                                  "outcome": [f"{h.outcome}/{h.failure_reason}" for h in mine]})
        finally:
            kube.close()
            world.stop()
    once = sum(1 for e in ended if e["outcomes"] == 1 and e["window"] not in e["pending"])
    kinds: dict[str, int] = {}
    for e in ended:
        for o in e["outcome"]:
            kinds[o] = kinds.get(o, 0) + 1
    return {"scenario": f"retune windows, SIGKILL mid-sweep, min-replicas-to-write {min_replicas}",
            "windows": len(ended), "ended_exactly_once": once, "outcomes": kinds, "windows_detail": ended}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=400.0)
    ap.add_argument("--down-after-ms", type=int, default=800)
    ap.add_argument("--only", choices=["a", "b", "c", "d", "e", "f"])
    ap.add_argument("--kills", type=int, default=10, help="master SIGKILLs in (f)")
    ap.add_argument("--freezes", type=int, default=5, help="master SIGSTOPs in (f)")
    ap.add_argument("--table", action="store_true", help="(f) only: the runs as a Markdown table")
    ap.add_argument("--dir", type=Path, help="work here and keep it (the processes' and Redis's logs); default: a temporary one")
    ap.add_argument("--windows", type=int, default=3, help="windows in (e) per setting")
    ap.add_argument("--repeat", type=int, default=1, help="runs of (b) per setting")
    ap.add_argument("--min-replicas", type=int, choices=[0, 1], help="only this min-replicas-to-write in (a), (b), (c), (e)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="powerfleet-failover-") as tmp:
        base = args.dir or Path(tmp)
        settings = (0, 1) if args.min_replicas is None else (args.min_replicas,)
        if args.only in (None, "a"):
            for mr in settings:
                results.append(resume(base / f"a-kill-{mr}", False, args.down_after_ms, mr))
                results.append(resume(base / f"a-graceful-{mr}", True, args.down_after_ms, mr))
        for section, unsynced in (("b", False), ("c", True)):
            if args.only in (None, section):
                for mr in settings:
                    for rep in range(args.repeat if section == "b" else 1):
                        results.append(loss(base / f"{section}-{mr}-{rep}", args.tasks, args.rate, mr, unsynced,
                                            args.down_after_ms))
        if args.only in (None, "d"):
            for follow in (False, True):
                results.append(loss(base / f"d-{follow}", args.tasks, args.rate, args.min_replicas or 0, False,
                                    args.down_after_ms, graceful=True, follow=follow))
        if args.only in (None, "e"):
            for mr in settings:
                results.append(windows(base / f"e-{mr}", args.windows, mr, args.down_after_ms))
        if args.only in (None, "f"):
            results.extend(repeated(base / "f", args.kills, args.freezes, args.down_after_ms))
    if args.table:
        print(table([r for r in results if "run" in r]))
    elif args.json:
        print(json.dumps(results, indent=2))
    else:
        for row in results:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
