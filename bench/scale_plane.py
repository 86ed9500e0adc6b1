"""bench/scale.py's budget pod LIST on the real control plane (etcd + kube-apiserver from the
cache, src/powerfleet/testing/controlplane; nothing is built): seed up to ``pods`` GPU pods (one
GPU each, 8 a node, bound by ``nodeName``; no kubelet, so they stay Pending) within ``seed_s``
seconds, then time ``KubeGpuPods.list_gpu_pods`` twice: wall, the client's CPU (this thread), the
apiserver's and etcd's CPU (/proc), pages, pods. Run: ``python bench/scale_plane.py [pods] [seed_s] [--profile]``;
``--profile`` prints where the client's CPU goes in a third, profiled LIST (cProfile, top 25 by own time).
Then the same pods through ``budget.pod_source: watch`` (cluster/gpu_pod_cache.py): the view's sync,
the memory it holds, a tick's read of it, and 100 new pods' way into it.

The pods are created over HTTP/1.1 by one asyncio client, 48 at a time (the official client in
8 threads made ~120 a second, bound by its own per-request cost, not the server's).
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import json
import pstats
import ssl
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.procstat import proc_cpu_s as _cpu_s  # noqa: E402 - a process's CPU seconds from /proc


def _tls(ca: str, crt: str, key: str) -> ssl.SSLContext:
    tls = ssl.create_default_context(cafile=ca)
    tls.load_cert_chain(crt, key)  # the admin user: authorization is not what is measured
    return tls


def _client(url: str, certs: tuple[str, str, str]):
    """A factory of httpx clients of the plane as its admin user (CA, cert, key): one per simulated agent."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=120)
    timeout = httpx.Timeout(connect=5.0, read=30.0, write=5.0, pool=None)  # a watch sets its own
    tls = _tls(*certs)
    return lambda: httpx.AsyncClient(base_url=url, verify=tls, limits=limits, timeout=timeout)


def _pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"w-{i}", "namespace": "default",
                         "labels": {"nvidia.com/dynamo-graph-deployment-name": f"dgd-{i % 1000}"},
                         "annotations": {"dynamo.nvidia.com/gpu-power-limit": "700"}},
            "spec": {"nodeName": f"gpu-{i // 8}", "containers": [{"name": "main", "image": "x",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def _seed(plane, pods: int, seed_s: float, at_once: int = 48) -> int:
    connect = _client(plane.url, (str(plane.pki.ca_crt), str(plane.pki.admin_crt), str(plane.pki.admin_key)))
    t0, nxt, made = time.monotonic(), iter(range(pods)), 0

    async def creator(http) -> None:
        nonlocal made
        for i in nxt:
            if time.monotonic() - t0 > seed_s:
                return
            r = await http.post("/api/v1/namespaces/default/pods", json=_pod(i))
            if r.status_code not in (201, 409):
                raise RuntimeError(f"seeding pod {i}: {r.status_code} {r.text[:200]}")
            made += 1
            if made % 10_000 == 0:
                print(f"seeded {made:,} pods ({time.monotonic() - t0:.0f} s)", file=sys.stderr)

    async with connect() as http:
        await asyncio.gather(*(creator(http) for _ in range(at_once)))
    return made


def main(pods: int, seed_s: float, profile: bool = False) -> dict:
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
            t0 = time.monotonic()
            made = asyncio.run(_seed(plane, pods, seed_s))
            out: dict = {"pods_seeded": made, "seed_s": time.monotonic() - t0, "rounds": []}
            print(f"seeded {made:,} pods in {out['seed_s']:.0f} s", file=sys.stderr)
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
            if profile:
                prof = cProfile.Profile(time.thread_time)  # this thread's CPU: the server's threads are not in it
                prof.enable()
                reader.list_gpu_pods()
                prof.disable()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
                print(text.getvalue(), file=sys.stderr)
            out["watch"] = _watched(plane, made, pids)
            kube.close()
            return out
        finally:
            plane.stop()


def _watched(plane, seeded: int, pids: dict) -> dict:
    """``budget.pod_source: watch`` on the real apiserver: the view's sync (its paginated LIST),
    what it holds (tracemalloc), a tick's read of it, and how soon 100 new pods reach it."""
    import tracemalloc

    from powerfleet.budget.tick import ledger_reads
    from powerfleet.cluster.gpu_pod_cache import GpuPodCache
    from powerfleet.cluster.gpu_pods import KubeGpuPods
    from powerfleet.cluster.keepalive import watch_api_client
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.testing.waiting import wait_for

    tracemalloc.start()
    s0 = {n: _cpu_s(p) for n, p in pids.items()}
    t0 = time.perf_counter()
    cache = GpuPodCache(KubeGpuPods(KubeCluster(watch_api_client(str(plane.kubeconfig)))), keep=ledger_reads).start()
    wait_for(lambda: cache.state == "synced", "the view's first LIST", timeout_s=600)
    out = {"sync_s": time.perf_counter() - t0, "pods_held": cache.size(),
           "held_mb": tracemalloc.get_traced_memory()[0] / 1e6,
           **{f"sync_{n}_cpu_s": _cpu_s(p) - s0[n] for n, p in pids.items()}}
    tracemalloc.stop()
    w0, c0 = time.perf_counter(), time.thread_time()
    served = cache.list_gpu_pods()
    out["read_wall_s"], out["read_cpu_s"], out["read_pods"] = time.perf_counter() - w0, time.thread_time() - c0, len(served)
    t0 = time.perf_counter()
    made = asyncio.run(_seed_range(plane, seeded, seeded + 100))
    wait_for(lambda: cache.size() >= out["pods_held"] + made, "100 new pods in the view", timeout_s=120)
    out["late_pods"], out["late_all_in_view_s"] = made, time.perf_counter() - t0
    out["stats"] = dict(cache.stats)
    print(json.dumps({"watch": out}), file=sys.stderr)
    cache.stop()
    return out


async def _seed_range(plane, start: int, stop: int) -> int:
    connect = _client(plane.url, (str(plane.pki.ca_crt), str(plane.pki.admin_crt), str(plane.pki.admin_key)))
    async with connect() as http:
        for i in range(start, stop):
            r = await http.post("/api/v1/namespaces/default/pods", json=_pod(i))
            if r.status_code != 201:
                raise RuntimeError(f"pod {i}: {r.status_code} {r.text[:200]}")
    return stop - start


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    args = [a for a in sys.argv[1:] if a != "--profile"]
    print(json.dumps(main(int(args[0]) if args else 80_000, float(args[1]) if len(args) > 1 else 240.0,
                          "--profile" in sys.argv[1:]), indent=2))
