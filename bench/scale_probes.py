"""bench/scale.py's probes of what does not scale with the fleet's work: a real beat's CPU per
tick sent, `powerfleet status --json`, and Flower's queue API and Broker page (wall, bytes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.load import _wait  # noqa: E402
from bench.procstat import children_cpu_s, proc_cpu_s  # noqa: E402


def say(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__().replace("'", "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def beat_cost(url: str, seconds: float, tmp: Path) -> dict[str, Any]:
    """A real beat with 1 s intervals, nothing consuming control: CPU seconds per tick sent."""
    import redis

    r = redis.Redis.from_url(url)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}", "POWERFLEET_BROKER__URL": url,
           "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "1", "POWERFLEET_BEAT__BUDGET_INTERVAL_S": "1",
           "POWERFLEET_BEAT__RETUNE_INTERVAL_S": "1", "POWERFLEET_BEAT__MAX_LOOP_INTERVAL_S": "1"}
    r.delete("control")
    with open(tmp / "beat.log", "wb") as log:
        p = subprocess.Popen([sys.executable, "-m", "powerfleet.cli", "beat", "-l", "WARNING"], env=env,
                             stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        _wait(lambda: r.llen("control") > 0, "beat's first tick", 120)
        n0, c0, t0 = r.llen("control"), proc_cpu_s(p.pid), time.perf_counter()
        time.sleep(seconds)  # a measuring window, not synchronisation
        n1, c1, wall = r.llen("control"), proc_cpu_s(p.pid), time.perf_counter() - t0
    finally:
        p.terminate()
        p.wait(30)
        r.delete("control")
    return {"ticks": n1 - n0, "cpu_s": c1 - c0, "wall_s": wall,
            "cpu_ms_per_tick": 1000 * (c1 - c0) / max(1, n1 - n0)}


def status_cost(url: str, tmp: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}", "POWERFLEET_BROKER__URL": url}
    c0, t0 = children_cpu_s(), time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "powerfleet.cli", "status", "--json"], env=env, cwd=tmp,
                       capture_output=True, timeout=300)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - c0
    if p.returncode != 0:
        raise SystemExit(f"bench: status failed ({p.returncode}): {p.stderr.decode()[-500:]}")
    data = json.loads(p.stdout)
    say(f"  status: {wall:.2f} s wall, {cpu:.2f} CPU s, {len(p.stdout)} bytes")
    return {"wall_s": wall, "cpu_s": cpu, "bytes": len(p.stdout), "queues": len(data["queues"]),
            "workers": len(data["workers"]), "agents": len(data["agents"]), "load": loadavg()}


def flower_cost(url: str, tmp: Path, timeout_s: float = 120.0) -> dict[str, Any]:
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}", "POWERFLEET_BROKER__URL": url}
    with open(tmp / "flower.log", "wb") as log:
        p = subprocess.Popen([sys.executable, "-m", "powerfleet.cli", "flower", "--port", str(port)], env=env,
                             stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    out: dict[str, Any] = {}
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{base}/healthcheck", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(up, "flower", 120)
        for name, path in (("queues_api", "/api/queues/length"), ("broker_page", "/broker")):
            for attempt in ("first", "second"):  # the first one may re-inspect the workers
                c0, t0 = proc_cpu_s(p.pid), time.perf_counter()
                try:
                    resp = httpx.get(base + path, timeout=timeout_s)
                except httpx.TimeoutException:
                    out[f"{name}_{attempt}"] = {"status": "timeout", "wall_s": time.perf_counter() - t0,
                                                "flower_cpu_s": proc_cpu_s(p.pid) - c0, "bytes": 0}
                    say(f"  flower {path}: no answer within {timeout_s:g} s")
                    break
                out[f"{name}_{attempt}"] = {"status": resp.status_code, "wall_s": time.perf_counter() - t0,
                                            "flower_cpu_s": proc_cpu_s(p.pid) - c0, "bytes": len(resp.content)}
                say(f"  flower {path} ({attempt}): {resp.status_code}, {out[name + '_' + attempt]['wall_s']:.2f} s, "
                    f"{len(resp.content)} bytes")
            if name == "queues_api" and resp.status_code == 200:
                out["queues_listed"] = len(resp.json().get("active_queues", []))
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(30)
    return out


if __name__ == "__main__":
    print(__doc__)  # a library of bench/scale.py; run that
