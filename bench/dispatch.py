"""Round-trip tasks per second: the fleet's app vs a bare Celery app, same broker, same run.

Both use one prefork worker process on an embedded redis-server and a no-op task. A
round trip is send -> worker -> result backend -> result read by the client. Each app is
measured in alternating rounds (so drift on the machine hits both) and the median is
printed. Goal (issue 2): the fleet's app costs under 10 % over bare Celery.

A third peer, bare Celery with the same soft/hard time limits the fleet sets on every
task, separates the cost of Celery's time-limit enforcement from the fleet's own code.

    .venv/bin/python bench/dispatch.py [--tasks 400] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from powerfleet.broker.embedded import EmbeddedRedis  # noqa: E402
from powerfleet.config import load_config  # noqa: E402
from powerfleet.workers.app import create_app  # noqa: E402


def wait_ping(app, name: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.control.ping(destination=[name], timeout=0.5):
            return
    raise SystemExit(f"worker {name} did not start")


def rate(app, task: str, n: int, **options) -> float:
    t0 = time.perf_counter()
    results = [app.send_task(task, **options) for _ in range(n)]
    for r in results:
        r.get(timeout=120)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-dispatch-"))
    with EmbeddedRedis() as server:
        env = {"POWERFLEET_BROKER__URL": server.url, "BENCH_BROKER_URL": server.url,
               "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "PATH": "/usr/bin:/bin"}
        os.environ["BENCH_BROKER_URL"] = server.url
        child_env = dict(os.environ, **env)
        fleet_app = create_app(load_config(environ={"POWERFLEET_BROKER__URL": server.url}))
        from bench.bare_app import app as bare  # noqa: E402  (reads BENCH_BROKER_URL)

        procs = [
            subprocess.Popen([sys.executable, "-m", "powerfleet.cli", "worker", "-Q", "control", "-n", "fleet@bench",
                              "-l", "WARNING"], env=child_env, stdout=open(logs / "fleet.log", "w"),
                             stderr=subprocess.STDOUT),
            subprocess.Popen([sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker", "-Q", "bare", "-c", "1",
                              "-n", "bare@bench", "-P", "prefork", "-l", "WARNING", "--without-mingle",
                              "--without-gossip"], env=child_env, cwd=ROOT, stdout=open(logs / "bare.log", "w"),
                             stderr=subprocess.STDOUT),
            subprocess.Popen([sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker", "-Q", "bare_limits",
                              "-c", "1", "-n", "barelim@bench", "-P", "prefork", "-l", "WARNING", "--without-mingle",
                              "--without-gossip"], env=dict(child_env, BENCH_BARE_TIME_LIMITS="1"), cwd=ROOT,
                             stdout=open(logs / "bare_limits.log", "w"), stderr=subprocess.STDOUT),
        ]
        try:
            wait_ping(fleet_app, "fleet@bench")
            wait_ping(bare, "bare@bench")
            wait_ping(bare, "barelim@bench")
            rate(fleet_app, "powerfleet.fleet.noop", 50)  # warm up every path
            rate(bare, "bare.noop", 50)
            rate(bare, "bare.noop", 50, queue="bare_limits")
            fleet_rates, bare_rates, limit_rates = [], [], []
            for _ in range(a.rounds):
                fleet_rates.append(rate(fleet_app, "powerfleet.fleet.noop", a.tasks))
                bare_rates.append(rate(bare, "bare.noop", a.tasks))
                limit_rates.append(rate(bare, "bare.noop", a.tasks, queue="bare_limits"))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
    f, b = statistics.median(fleet_rates), statistics.median(bare_rates)
    lim = statistics.median(limit_rates)
    overhead = (b / f - 1) * 100
    own = (lim / f - 1) * 100
    out = {"tasks_per_round": a.tasks, "rounds": a.rounds, "fleet_tasks_per_s": round(f, 1),
           "bare_celery_tasks_per_s": round(b, 1), "bare_celery_with_time_limits_tasks_per_s": round(lim, 1),
           "fleet_over_bare_ratio": round(f / b, 3), "fleet_overhead_pct": round(overhead, 1),
           "fleet_overhead_vs_bare_with_limits_pct": round(own, 1), "goal_overhead_pct": 10}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"fleet app : {f:8.1f} round trips/s (rounds: {', '.join(f'{x:.0f}' for x in fleet_rates)})")
        print(f"bare      : {b:8.1f} round trips/s (rounds: {', '.join(f'{x:.0f}' for x in bare_rates)})")
        print(f"bare+limits: {lim:7.1f} round trips/s (rounds: {', '.join(f'{x:.0f}' for x in limit_rates)})")
        print(f"ratio fleet/bare = {f / b:.3f}; fleet overhead = {overhead:+.1f}% (goal < 10%)")
        print(f"fleet overhead over bare Celery with the same time limits = {own:+.1f}%")


if __name__ == "__main__":
    main()
