"""The digital twin's cost: CPU seconds per wall second at 4, 16 and 64 simulated GPU nodes.

Runs the twin alone (API server, operator loop through the official client, GPU nodes with
their files and proc roots, frontends, traffic and the power model; no fleet processes) for
``--seconds`` at each size, after a warm-up in which every pod starts, and prints the twin
process's CPU time (all threads) per wall second, and per node. The demo's fleet processes
(workers, one agent per node) cost on top of this; their cost is not the twin's.

    .venv/bin/python bench/demo.py [--nodes 4 16 64] [--seconds 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from powerfleet.twin.runtime import Twin, TwinOptions  # noqa: E402
from powerfleet.twin.cluster.topology import TwinSpec  # noqa: E402


def measure(nodes: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-twin-") as tmp:
        twin = Twin(TwinOptions(spec=TwinSpec(nodes=nodes), root=Path(tmp), window_s=10)).start()
        try:
            deadline = time.monotonic() + 120
            # Warm-up: every pod Ready and both frontends serving (the steady state the demo runs in).
            while time.monotonic() < deadline:
                pods = twin.api.list("v1", "Pod")
                ready = [p for p in pods if any(c.get("type") == "Ready" and c.get("status") == "True"
                                                for c in (p.get("status") or {}).get("conditions") or [])]
                if pods and len(ready) == len(pods) and len(twin.frontends) == 2:
                    break
                time.sleep(0.5)
            cpu0, wall0, n0 = time.process_time(), time.monotonic(), len(twin.samples)
            time.sleep(seconds)
            cpu, wall, ticks = time.process_time() - cpu0, time.monotonic() - wall0, len(twin.samples) - n0
        finally:
            twin.stop()
    return {"nodes": nodes, "gpus": nodes * 8, "pods": len(pods), "cpu_s_per_s": round(cpu / wall, 4),
            "cpu_s_per_s_per_node": round(cpu / wall / nodes, 5), "ticks_per_s": round(ticks / wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(n, args.seconds) for n in args.nodes]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'nodes':>5} {'GPUs':>5} {'pods':>5} {'CPU s/s':>8} {'per node':>9} {'ticks/s':>8}")
    for r in rows:
        print(f"{r['nodes']:>5} {r['gpus']:>5} {r['pods']:>5} {r['cpu_s_per_s']:>8.3f} "
              f"{r['cpu_s_per_s_per_node']:>9.4f} {r['ticks_per_s']:>8.2f}")


if __name__ == "__main__":
    main()
