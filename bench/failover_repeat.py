"""bench/failover.py (f): the master lost again and again under the whole fleet, one row per loss.

Real processes on loopback: a master, two replicas and three Sentinels (Sentinel's internal
periods shortened as in the tests, so that the killed node, restarted as a replica between runs,
is taken in within seconds; down-after as given), the loopback API server, and the fleet on
``sentinel://`` URLs: two beats (one leads, one stands by), a control worker, and one agent per
node on simulated GPUs whose pod requests 320 W. A client publishes ``powerfleet.fleet.noop``
tasks with known ids, 20 a second, from before each loss until ticks have resumed.

Per run (``kill``: SIGKILL of the master, its node restarted as a replica afterwards; ``freeze``:
SIGSTOP, SIGCONT once a replica was promoted, so that Sentinel demotes it):

* ``promoted_s``: loss -> the first Sentinel announces the new master (+switch-master, its log);
* ``resumed_s``: loss -> the first tick of every family (reconcile, budget, retune) run after it,
  read on the promoted master; ``after_promotion_s`` = resumed - promoted;
* ``beat_single``: the ticks recorded since the run began came from one beat at a time (each
  sender's ticks form one unbroken stretch of the tick log), ``beats``: how many sent;
* ``duplicates``: task ids that succeeded more than once in any fleet process's log this run
  (the noop tasks, the ticks, the agents' passes);
* ``lost``: noop publishes the client was told succeeded that never ran (after a 30 s wait);
  ``refused``: publishes that raised (the sender knows: nothing lost);
* ``caps_kept``: every GPU at its pod's 320 W whenever sampled (every 0.1 s) through the run;
* ``alive``: no fleet process exited.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Self

import redis

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.beat.ticklog import TickLog
from powerfleet.broker.clients import redis_client
from powerfleet.broker.embedded import free_loopback_port
from powerfleet.config import load_config
from powerfleet.testing.failover import node_pod, sim_device
from powerfleet.testing.sentinels import SentinelCluster
from powerfleet.testing.waiting import wait_for, wait_worker
from powerfleet.twin.apiserver import ApiServer
from powerfleet.workers.app import TICK_FAMILIES, create_app
from powerfleet.workers.launcher import Launcher

NODES = ("gpu-node-f1", "gpu-node-f2")
CAP_W = 320
RESUME_TIMEOUT_S = 120  # a run whose ticks do not resume within this is recorded as such, and the next one runs
SUCCEEDED = re.compile(r"Task (\S+)\[([0-9a-zA-Z_.:-]+)\] succeeded")


class Background:
    """A daemon thread running ``_loop`` for the length of a ``with`` block."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


class Publisher(Background):
    """noop tasks with known ids at ``rate`` per second, counting what the client was told."""

    def __init__(self, app: Any, run: str, rate: float = 20.0) -> None:
        super().__init__()
        self.app, self.run, self.rate = app, run, rate
        self.acked: list[str] = []
        self.refused = 0

    def _loop(self) -> None:
        i = 0
        while not self._stop.is_set():
            task_id = f"{self.run}-{i}"
            i += 1
            try:
                self.app.send_task("powerfleet.fleet.noop", kwargs={}, task_id=task_id, ignore_result=True,
                                   expires=600)
                self.acked.append(task_id)
            except Exception:  # noqa: BLE001 - the caller saw the failure: refused, not lost
                self.refused += 1
            self._stop.wait(1.0 / self.rate)


class CapWatch(Background):
    """Samples every GPU's limit every 0.1 s; ``off`` lists each (node, limit) that differed from the pod's cap."""

    def __init__(self, gpus: dict[str, SimulatedGpus]) -> None:
        super().__init__()
        self.gpus = gpus
        self.off: list[tuple[str, int]] = []

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for node, gpus in self.gpus.items():
                try:
                    limit = gpus.read_limit(0)
                except (OSError, ValueError):  # the agent rewriting the file: read it next time
                    continue
                if limit != CAP_W * 1000:
                    self.off.append((node, limit))

def successes(logs: list[Path], offsets: dict[Path, int], names: dict[str, str] | None = None) -> Counter[str]:
    """Task ids that succeeded in the logs after ``offsets`` (moved to the logs' ends); ``names``: id -> task."""
    seen: Counter[str] = Counter()
    for log in logs:
        with open(log, "rb") as f:
            f.seek(offsets.get(log, 0))
            text = f.read().decode(errors="replace")
            offsets[log] = f.tell()
        for m in SUCCEEDED.finditer(text):
            seen[m.group(2)] += 1
            if names is not None:
                names[m.group(2)] = f"{m.group(1)} ({log.stem})"
    return seen


def first_tick(ticks: TickLog, family: str, since: float, timeout_s: float = RESUME_TIMEOUT_S) -> float | None:
    """Seconds from ``since`` to the first tick of ``family`` after it; None: none within ``timeout_s``."""
    try:
        return wait_for(lambda: (t := ticks.last_ticks().get(family, 0)) > since and t, f"a {family} tick",
                        timeout_s, 0.05) - since
    except AssertionError:
        return None


def switched_at(cluster: SentinelCluster, new: int, since: float) -> float | None:
    """When the first Sentinel announced ``new`` as master (+switch-master in its log) after ``since``:
    the promotion (a port is master again in a later run: earlier announcements are left out)."""
    times = []
    for log in cluster.dir.glob("sentinel-*/sentinel.log"):
        for line in log.read_text(errors="replace").splitlines():
            fields = line.split()
            if "+switch-master" in fields and fields[-1] == str(new):
                stamp = " ".join(fields[1:5])  # 01 Dec 2026 23:55:55.444 (local time)
                whole, _, ms = stamp.partition(".")
                at = time.mktime(time.strptime(whole, "%d %b %Y %H:%M:%S")) + int(ms or 0) / 1000
                if at >= since - 0.001:
                    times.append(at)
    return min(times, default=None)


def one_at_a_time(origins: list[str]) -> bool:
    """Each sender's entries form one unbroken stretch (no two beats interleaved)."""
    done: set[str] = set()
    for i, origin in enumerate(origins):
        if i and origin != origins[i - 1]:
            done.add(origins[i - 1])
            if origin in done:
                return False
    return True


def one_run(kind: str, n: int, cluster: SentinelCluster, app: Any, launcher: Launcher, watch: dict[str, Any],
            offsets: dict[Path, int]) -> dict[str, Any]:
    ticks_any = TickLog(redis_client(cluster.url, app.fleet_config.broker, socket_timeout=2))
    before = ticks_any.counts().get("reconcile", 0)
    seen: Counter[str] = Counter()
    names: dict[str, str] = {}
    with Publisher(app, f"{kind}{n}") as pub, CapWatch(watch["gpus"]) as caps:
        wait_for(lambda: len(pub.acked) >= 20, "publishes before the loss", 60)
        old = cluster.master_port()
        lost_at = time.time()
        (cluster.kill if kind == "kill" else cluster.freeze)(old)
        new = cluster.wait_new_master(old, timeout_s=60)
        promoted = (switched_at(cluster, new, lost_at) or time.time()) - lost_at
        client = redis.Redis(host="127.0.0.1", port=new, socket_timeout=2)
        on_new = TickLog(client)
        first = {f: first_tick(on_new, f, lost_at) for f in TICK_FAMILIES}
        time.sleep(2.0)  # a measurement window after the recovery, not a synchronisation
    if kind == "freeze":
        cluster.thaw(old)
        cluster.wait_demoted(old, timeout_s=60)
    acked = list(pub.acked)

    def all_ran() -> bool:
        seen.update(successes(watch["logs"], offsets, names))
        return all(t in seen for t in acked)

    try:
        wait_for(all_ran, "every acknowledged noop to run", 30, every_s=0.5)
    except AssertionError:
        pass  # what never ran is counted as lost below
    counts = on_new.counts().get("reconcile", 0)
    origins = on_new.origins("reconcile")[: max(0, counts - before)]
    client.close()
    cluster.restore()
    resumed = max(first.values(), key=lambda v: float("inf") if v is None else v)
    resumed = None if resumed is None else round(resumed, 2)
    return {"run": f"{kind} {n}", "at": time.strftime("%H:%M:%S", time.gmtime(lost_at)),
            "promoted_s": round(promoted, 2), "resumed_s": resumed,
            "after_promotion_s": None if resumed is None else round(resumed - promoted, 2),
            "first_tick_s": {f: None if v is None else round(v, 2) for f, v in first.items()},
            "beat_single": one_at_a_time(origins), "beats": len(set(origins)),
            "duplicates": sum(1 for c in seen.values() if c > 1),
            "duplicated": sorted({names[t] for t, c in seen.items() if c > 1}),
            "published": len(acked), "refused": pub.refused, "lost": sum(1 for t in acked if t not in seen),
            "caps_kept": not caps.off, "caps_off": sorted(set(caps.off))[:4],
            "alive": not launcher.dead_children()}


def repeated(base: Path, kills: int, freezes: int, down_after_ms: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with SentinelCluster(base / "redis", replicas=2, down_after_ms=down_after_ms, fast=True,
                         failover_timeout_ms=4000) as cluster, ApiServer() as api:
        kubeconfig = api.write_kubeconfig(base / "kubeconfig")
        env = {**cluster.env(), "POWERFLEET_NODES": f"[{', '.join(NODES)}]",
               "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_BEAT__BUDGET_INTERVAL_S": "1",
               "POWERFLEET_BEAT__RETUNE_INTERVAL_S": "1", "POWERFLEET_BEAT__LOCK_TIMEOUT_S": "5",
               "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "1",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(base / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(kubeconfig), "POWERFLEET_AGENT__NAMESPACES": "[llm]"}
        app = create_app(load_config(environ=env))
        gpus: dict[str, SimulatedGpus] = {}
        with Launcher(log_dir=base / "logs", env=dict(env)) as launcher:
            for i, node in enumerate(NODES):
                uid = f"{i:08d}-0000-4000-8000-00000000000{i}"
                api.apply(node_pod(node, uid, CAP_W))
                write_proc_entry(base / "proc" / node, 4242, uid)
                gpus[node] = SimulatedGpus.shared(base / "sim" / f"{node}.json", [sim_device(0, pids=[4242])])
                launcher.spawn(node, "agent", "--node", node, env={
                    "POWERFLEET_AGENT__PROC_ROOT": str(base / "proc" / node),
                    "POWERFLEET_AGENT__STATE_DIR": str(base / "state" / node),
                    "POWERFLEET_AGENT__PROBE_PORT": str(free_loopback_port())})
            launcher.spawn("ctl", "worker", "--queues", "control,sweep", "--name", "ctl@repeat")
            for name in ("ctl@repeat", *(f"agent@{n}" for n in NODES)):
                wait_worker(app, name, timeout_s=120)
            for node in NODES:
                wait_for(lambda n=node: gpus[n].read_limit(0) == CAP_W * 1000, f"{node} at its pod's cap", 60)
            launcher.spawn("beat-a", "beat")
            launcher.spawn("beat-b", "beat")  # stands by on the RedBeat lock
            ticks = TickLog(redis_client(cluster.url, app.fleet_config.broker, socket_timeout=2))
            wait_for(lambda: all(ticks.counts().get(f, 0) >= 2 for f in TICK_FAMILIES), "the first ticks", 120)
            watch = {"gpus": gpus, "logs": [c.log for c in launcher.children]}
            offsets: dict[Path, int] = {}
            successes(watch["logs"], offsets)  # start-up's tasks are not a run's
            for kind, count in (("kill", kills), ("freeze", freezes)):
                for n in range(1, count + 1):
                    rows.append(one_run(kind, n, cluster, app, launcher, watch, offsets))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # as it comes: a long run shows progress
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The runs as a Markdown table (docs/benchmarks.md)."""
    head = ("| run | promoted (s) | ticks resumed (s) | after promotion (s) | beat single | duplicate runs "
            "| lost / published | refused | caps kept | processes alive |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {r['run']} | {r['promoted_s']} | {r['resumed_s'] or f'none in {RESUME_TIMEOUT_S} s'} | "
             f"{r['after_promotion_s'] if r['after_promotion_s'] is not None else '-'} | "
             f"{'yes' if r['beat_single'] else 'NO'} ({r['beats']}) | {r['duplicates']} | {r['lost']} / {r['published']} | "
             f"{r['refused']} | {'yes' if r['caps_kept'] else 'NO'} | {'yes' if r['alive'] else 'NO'} |" for r in rows]
    return "\n".join([head, *lines])
