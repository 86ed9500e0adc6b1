"""bench/scale.py's budget pod LIST on the real control plane (etcd + kube-apiserver from the
cache, src/powerfleet/testing/controlplane; nothing is built): seed up to ``pods`` GPU pods (one
GPU each, 8 a node, bound by ``nodeName``; no kubelet, so they stay Pending) within ``seed_s``
seconds, then time ``KubeGpuPods.list_gpu_pods`` twice: wall, the client's CPU (this thread), the
apiserver's and etcd's CPU (/proc), pages, pods. Run: ``python bench/scale_plane.py [pods] [seed_s]``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"w-{i}", "namespace": "default",
                         "labels": {"nvidia.com/dynamo-graph-deployment-name": f"dgd-{i % 1000}"},
                         "annotations": {"dynamo.nvidia.com/gpu-power-limit": "700"}},
            "spec": {"nodeName": f"gpu-{i // 8}", "containers": [{"name": "main", "image": "x",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def main(pods: int, seed_s: float) -> dict:
    from kubernetes import client, config

    from powerfleet.cluster.gpu_pods import KubeGpuPods
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.testing.controlplane import ControlPlane, built_bin_dir

    bin_dir = built_bin_dir()
    if bin_dir is None:
        return {"skipped": "no control-plane binaries in the cache"}
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(bin_dir, Path(tmp))
        try:
            plane.start()
            api = config.new_client_from_config(config_file=str(plane.kubeconfig))
            core = client.CoreV1Api(api)
            t0, made = time.monotonic(), 0

            def make(i: int) -> int:
                if time.monotonic() - t0 > seed_s:
                    return 0
                core.create_namespaced_pod("default", _pod(i), _preload_content=False)
                return 1

            with ThreadPoolExecutor(8) as pool:
                made = sum(pool.map(make, range(pods)))
            out: dict = {"pods_seeded": made, "seed_s": time.monotonic() - t0, "rounds": []}
            kube = KubeCluster.from_kubeconfig(str(plane.kubeconfig))
            reader = KubeGpuPods(kube)
            pids = {n: p.popen.pid for n, p in plane.procs.items() if p.popen}
            for _ in range(2):
                s0 = {n: _cpu_s(p) for n, p in pids.items()}
                w0, c0 = time.perf_counter(), time.thread_time()
                got = reader.list_gpu_pods()
                row = {"wall_s": time.perf_counter() - w0, "client_cpu_s": time.thread_time() - c0,
                       "pods": len(got), "pages": reader.pages_read,
                       **{f"{n}_cpu_s": _cpu_s(p) - s0[n] for n, p in pids.items()}}
                out["rounds"].append(row)
                print(json.dumps(row), file=sys.stderr)
            kube.close()
            return out
        finally:
            plane.stop()


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 80_000,
                          float(sys.argv[2]) if len(sys.argv) > 2 else 240.0), indent=2))
