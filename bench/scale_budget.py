"""bench/scale.py part (e): the budget tick at scale, as bench/budget.py measures it.

1,000 deployments (``deployments``) in 50 racks over ``nodes`` nodes, their replicas scaled so
the cluster holds about 8 GPU pods per node (one GPU each): 8,000 pods at 1,000 nodes, 80,000 at
10,000. The loopback API server and the client run in this one process, so the CPU seconds
include the server's. ``tick_reads`` splits them: the client (the fleet's own cost: the call, the
parse, the ledger) runs on the calling thread, whose ``thread_time`` it reports as
``client_cpu_s``; the server answers on its own request threads, ``server_cpu_s`` = the process's
CPU less the client's (a real kube-apiserver's cost is not the fleet's).
"""

from __future__ import annotations

import time
from typing import Any, Callable


def budget_size(nodes: int, deployments: int, say: Callable[[str], None]) -> dict[str, Any]:
    from bench.budget import bench_api_tick

    scale = max(1, round(8 * nodes / (4 * deployments)))  # bench/budget.py's fleet averages 4 pods each
    t0 = time.perf_counter()
    got = bench_api_tick(deployments, nodes, 50, 7, batched=True, scale=scale)
    got["bench_wall_s"] = time.perf_counter() - t0
    got["deployments"], got["scale"] = deployments, scale
    say(f"  budget: {got['pods']} pods; tick reads {got['tick_s']:.2f} s ({got['tick_cpu_s']:.2f} CPU s), "
        f"{got['tick_calls']} calls, {got['tick_bytes'] / 1e6:.1f} MB; scaling tick's evaluations "
        f"{got['first']['wall_s']:.1f} s, {got['first']['calls']} calls")
    return got


def tick_reads(nodes: int, deployments: int, say: Callable[[str], None], rounds: int = 2) -> dict[str, Any]:
    """The budget tick's reads and allowances alone (``tick_limits``), ``rounds`` times, on the same
    world as ``budget_size``: wall and CPU seconds, API calls and bytes, the process's peak RSS."""
    import logging
    import resource
    import tempfile
    from pathlib import Path

    import redis

    from bench.budget import _seed_world, admitted, count_calls, fleet
    from powerfleet.broker.embedded import EmbeddedRedis
    from powerfleet.budget.evidence import RedisReports
    from powerfleet.budget.tick import tick_limits
    from powerfleet.clock import FakeClock
    from powerfleet.cluster.dra import KubeDra
    from powerfleet.cluster.gpu_pods import KubeGpuPods
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.twin.apiserver import ApiServer

    logging.getLogger("powerfleet").setLevel(logging.ERROR)
    scale = max(1, round(8 * nodes / (4 * deployments)))
    views, groups, budgets = fleet(deployments, nodes, 50, 7, scale)
    out: dict[str, Any] = {"pods": sum(len(v.pods) for v in views), "rounds": []}
    with EmbeddedRedis() as broker, ApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        r, clock = redis.Redis.from_url(broker.url), FakeClock(t=1_800_000_000.0)
        t0 = time.perf_counter()
        _seed_world(api, r, views, groups, clock.now())
        say(f"  reads: seeded {out['pods']} pods in {time.perf_counter() - t0:.0f} s")
        kube = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(Path(tmp) / "kc")))
        seen = count_calls(kube)
        state, cfg = admitted(r, views, scale)
        for _ in range(rounds):
            calls, sent, t0 = seen["n"], seen["bytes"], time.perf_counter()
            c0, m0 = time.process_time(), time.thread_time()
            tick_limits(kube, state, cfg, budgets, "powerfleet.io/rack", KubeGpuPods(kube), RedisReports(r),
                        now=clock.now(), fresh_s=45.0, max_settable_w=1000, dra=KubeDra(kube))
            cpu, client = time.process_time() - c0, time.thread_time() - m0
            got = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu, "client_cpu_s": client,
                   "server_cpu_s": cpu - client,
                   "calls": seen["n"] - calls, "bytes": seen["bytes"] - sent,
                   "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                   "load": Path("/proc/loadavg").read_text().split()[:3]}
            out["rounds"].append(got)
            say(f"  reads: {got['wall_s']:.2f} s wall, {got['cpu_s']:.2f} CPU s (client {client:.2f}, "
                f"server {cpu - client:.2f}), {got['calls']} calls, "
                f"{got['bytes'] / 1e6:.1f} MB, peak RSS {got['maxrss_mb']} MB, load {got['load']}")
        # The pod LIST alone under tracemalloc (Python's allocations, the server's serialising of
        # one page included): what the client holds while it reads every page
        import tracemalloc

        tracemalloc.start()
        listed = KubeGpuPods(kube).list_gpu_pods()
        held, peak = tracemalloc.get_traced_memory()
        out["pod_list_peak_mb"], out["pod_list_held_mb"] = peak / 1e6, held / 1e6
        tracemalloc.stop()
        say(f"  reads: the pod LIST of {len(listed)} pods peaked at {peak / 1e6:.0f} MB traced; "
            f"its {len(listed)} ledger views hold {held / 1e6:.0f} MB")
        del listed
        out["watch"] = _watched_reads(api, kube, Path(tmp) / "kc", r, state, cfg, budgets, clock, seen, say, rounds)
        kube.close()
    return out


def _watched_reads(api: Any, kube: Any, kubeconfig: Any, r: Any, state: Any, cfg: Any, budgets: Any, clock: Any, seen: dict[str, int],
                   say: Callable[[str], None], rounds: int) -> dict[str, Any]:
    """The same tick with ``budget.pod_source: watch``: the view's first LIST (its sync), the memory
    it holds (tracemalloc), then ``rounds`` ticks reading it, and how soon 100 new pods reach it. The view
    has its own client, as in the control worker (``count_calls`` reads each response whole: a watch's
    would never end)."""
    import tracemalloc

    from powerfleet.budget.evidence import RedisReports
    from powerfleet.budget.tick import ledger_reads, tick_limits
    from powerfleet.cluster.dra import KubeDra
    from powerfleet.cluster.gpu_pod_cache import GpuPodCache
    from powerfleet.cluster.gpu_pods import KubeGpuPods
    from powerfleet.cluster.keepalive import watch_api_client
    from powerfleet.cluster.kube import KubeCluster
    from powerfleet.testing.waiting import wait_for

    tracemalloc.start()
    t0 = time.perf_counter()
    cache = GpuPodCache(KubeGpuPods(KubeCluster(watch_api_client(str(kubeconfig)))), keep=ledger_reads).start()
    wait_for(lambda: cache.state == "synced", "the view's first LIST", timeout_s=600)
    out: dict[str, Any] = {"sync_s": time.perf_counter() - t0, "pods_held": cache.size(), "rounds": []}
    out["held_mb"] = tracemalloc.get_traced_memory()[0] / 1e6
    tracemalloc.stop()
    say(f"  watch: the view synced in {out['sync_s']:.2f} s and holds {cache.size()} pods in {out['held_mb']:.0f} MB")
    for _ in range(rounds):
        calls, sent, t0 = seen["n"], seen["bytes"], time.perf_counter()
        c0, m0 = time.process_time(), time.thread_time()
        tick_limits(kube, state, cfg, budgets, "powerfleet.io/rack", cache, RedisReports(r),
                    now=clock.now(), fresh_s=45.0, max_settable_w=1000, dra=KubeDra(kube))
        cpu, client = time.process_time() - c0, time.thread_time() - m0
        got = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu, "client_cpu_s": client,
               "calls": seen["n"] - calls, "bytes": seen["bytes"] - sent}
        out["rounds"].append(got)
        say(f"  watch: tick reads {got['wall_s']:.2f} s wall, {cpu:.2f} CPU s (client {client:.2f}), "
            f"{got['calls']} calls, {got['bytes'] / 1e6:.2f} MB")
    before = cache.size()
    t0 = time.perf_counter()
    for i in range(100):
        api.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"late-{i}", "namespace": "bench-late"},
                   "spec": {"nodeName": "n-0", "containers": [{"name": "m", "image": "m", "resources": {
                       "limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}})
    created = time.perf_counter() - t0
    wait_for(lambda: cache.size() >= before + 100, "100 new pods in the view", timeout_s=120)
    out["late_100_s"], out["late_100_created_s"] = time.perf_counter() - t0, created
    out["stats"] = dict(cache.stats)
    say(f"  watch: 100 new pods created in {created:.2f} s were all in the view {out['late_100_s']:.2f} s "
        f"after the first; {cache.stats}")
    cache.stop()
    return out
