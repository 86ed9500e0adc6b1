"""How long the real control plane takes to start (docs/benchmarks.md, "Real control plane").

    python bench/control_plane.py [--runs N]

Starts etcd + kube-apiserver, then kube-scheduler, kube-controller-manager and kwok with four fake
GPU nodes, as the control_plane tier's fixtures do, and prints each step's seconds; stops everything.
Needs the binaries (make control-plane). The build's own times are in the cache directory's
build-times.txt, printed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client

from powerfleet.testing.controlplane import ControlPlane, built_bin_dir, gpu_node
from powerfleet.testing.controlplane.crds import real_server_crds

NODES = {"gpu-a-1": "rack-a", "gpu-a-2": "rack-a", "gpu-b-1": "rack-b", "gpu-b-2": "rack-b"}


def one_run(bin_dir: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(bin_dir, Path(tmp))
        try:
            plane.start()
            from kubernetes import config

            api = config.new_client_from_config(config_file=str(plane.kubeconfig))
            t0 = time.monotonic()
            for crd in real_server_crds():
                client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
            plane.start_seconds["CRDs created"] = time.monotonic() - t0
            plane.start_scheduler()
            plane.start_controller_manager()
            plane.start_kwok(bin_dir.parent / "kwok-stages.yaml")
            core = client.CoreV1Api(api)
            t0 = time.monotonic()
            for name, rack in NODES.items():
                core.create_node(gpu_node(name, rack=rack))
            while not all(any(c.type == "Ready" and c.status == "True" for c in core.read_node(n).status.conditions or [])
                          for n in NODES):
                time.sleep(0.1)
            plane.start_seconds["4 kwok nodes Ready"] = time.monotonic() - t0
            api.close()
            return dict(plane.start_seconds)
        finally:
            plane.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    bin_dir = built_bin_dir()
    if bin_dir is None:
        print("control plane not built (make control-plane)", file=sys.stderr)
        return 2
    runs = [one_run(bin_dir) for _ in range(args.runs)]
    print(f"{'step':<40} {'median s':>9} {'max s':>7}  ({args.runs} runs)")
    for step in runs[0]:
        values = [r[step] for r in runs]
        print(f"{step:<40} {statistics.median(values):>9.2f} {max(values):>7.2f}")
    times = bin_dir.parent / "build-times.txt"
    if times.exists():
        print(f"\nbuild ({times}):\n{times.read_text().rstrip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
