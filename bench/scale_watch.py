"""The agents' pod views at fleet scale, on the real control plane (issue 36's unmeasured row).

Every ``powerfleet agent`` keeps its node's pods in memory (agent/podcache.py): one LIST
(``fieldSelector=spec.nodeName=<node>``, ``resourceVersion=0``), then a WATCH from the list's
version that the server ends every 30 s and the agent resumes from the last version it saw; a
``410 Gone`` makes it relist. This bench plays N such agents against a real etcd and
kube-apiserver (src/powerfleet/testing/controlplane, binaries from ``make control-plane``), on the
wire as the agent does it (HTTP/1.1 over TLS, one connection per agent, the same query), with
pods changing on random nodes meanwhile, and reports what the API server pays:

- ``open_s``: seconds until every agent's first watch was answered (LIST + WATCH, 200 at a time);
- ``apiserver_rss_mb`` before and with every watch open; its CPU seconds per second over the hold;
- the requests it served per second, by kind (LIST, WATCH, and ``expired``: watches answered
  410, each followed by a relist);
- event latency: a pod's annotation PATCH sent until its agent's watch delivers it (p50, p99,
  max), and ``misdelivered``: events for a pod on another node (the field selector's promise);
- ``watching``: kube-apiserver's own ``apiserver_longrunning_requests`` for pod WATCHes.

``--bookmarks`` asks for ``allowWatchBookmarks`` as the agent does (agent/podcache.py): the server
then sends the current version before each watch ends, so a quiet node's resumed watch is not
older than the watch cache's history. ``--no-bookmarks`` is the agent before that change.
``--watch-timeout`` is each watch's server timeout: ``drawn`` (the default) draws it per watch in
[300, 600) s as the agent does; a number fixes it (30: the agent before that change, the peer).

    .venv/bin/python bench/scale_watch.py [--nodes 10000] [--hold-s 150] [--churn 20] [--busy-nodes K]
                                          [--bookmarks | --no-bookmarks] [--watch-timeout drawn|S]
                                          [--procs P] [--json]

The agents are split over ``--procs`` client processes (one event loop each: one loop opens
about 60 watches a second at a full core). They run on the same cores as the server: their CPU
is reported too, and the server's figures are its own process's (/proc). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue
import random
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.procstat import proc_cpu_s as _cpu_s  # noqa: E402 - a process's CPU seconds from /proc
from bench.scale_plane import _client  # noqa: E402 - an HTTP client of the plane
from powerfleet.agent.podcache import READ_TIMEOUT_S, WATCH_MIN_S  # noqa: E402 - what the agent asks for

OPEN_AT_ONCE = 200  # agents whose first LIST + WATCH are in flight together (over all client processes)
REPORT_EVERY_S = 2.0  # a client process's counts to the main process
LATENCY_ANNOTATION = "bench.powerfleet.dev/sent"


def say(msg: str) -> None:
    print(f"[scale_watch {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _node(i: int) -> str:
    return f"gpu-{i:05d}"


def _pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"w-{i}", "namespace": "default",
                         "annotations": {"dynamo.nvidia.com/gpu-power-limit": "700"}},
            "spec": {"nodeName": _node(i), "containers": [{"name": "main", "image": "x",
                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}


@dataclass
class Counts:
    lists: int = 0
    watches: int = 0
    expired: int = 0
    bookmarks: int = 0
    events: int = 0
    misdelivered: int = 0
    errors: int = 0
    first_error: str = ""
    latencies: list[float] = field(default_factory=list)
    watching_now: int = 0
    opened: int = 0
    agents: int = 0  # how many agents there are: ``opened`` reaching it means every watch is open

    def error(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why[:200]

    def snapshot(self, *, latencies: bool = False) -> dict:
        got = {k: v for k, v in vars(self).items() if k != "latencies"}
        if latencies:
            got["latencies"] = list(self.latencies)
        return got


TOTALS = ("lists", "watches", "expired", "bookmarks", "events", "misdelivered", "errors", "watching_now", "opened")


def _total(snapshots: dict[int, dict]) -> dict:
    got = {k: sum(snap.get(k, 0) for snap in snapshots.values()) for k in TOTALS}
    got["first_error"] = next((snap["first_error"] for snap in snapshots.values() if snap.get("first_error")), "")
    return got


async def agent(connect, node: str, bookmarks: bool, timeout_s, counts: Counts, gate: asyncio.Semaphore,
                opened: asyncio.Event, stop: asyncio.Event) -> None:
    """One agent's pod view, as agent/podcache.py keeps it (the bookkeeping, not the pod state).
    Each agent has a client of its own, as each real agent does (and httpx's pool scans every
    connection it holds on each request: one pool of 10,000 would measure httpx)."""
    async with connect() as http:
        await _pod_view(http, node, bookmarks, timeout_s, counts, gate, opened, stop)


async def _pod_view(http, node: str, bookmarks: bool, timeout_s, counts: Counts, gate: asyncio.Semaphore,
                    opened: asyncio.Event, stop: asyncio.Event) -> None:
    import httpx

    selector = f"spec.nodeName={node}"
    version, first = "", True
    while not stop.is_set():
        try:
            if first:
                await gate.acquire()
            try:
                if not version:
                    counts.lists += 1
                    r = await http.get("/api/v1/pods", params={"fieldSelector": selector, "resourceVersion": "0",
                                                              "timeoutSeconds": "20"})
                    r.raise_for_status()
                    version = r.json()["metadata"]["resourceVersion"]
                server_s = timeout_s()
                params = {"watch": "true", "fieldSelector": selector, "resourceVersion": version,
                          "timeoutSeconds": str(server_s)}
                if bookmarks:
                    params["allowWatchBookmarks"] = "true"
                counts.watches += 1
                deadline = httpx.Timeout(connect=5.0, read=server_s + READ_TIMEOUT_S, write=5.0, pool=None)
                async with http.stream("GET", "/api/v1/pods", params=params, timeout=deadline) as r:
                    if first:
                        first = False
                        gate.release()
                        counts.opened += 1
                        if counts.opened == counts.agents:
                            opened.set()
                    if r.status_code == 410:
                        counts.expired += 1
                        version = ""
                        continue
                    r.raise_for_status()
                    counts.watching_now += 1
                    try:
                        async for line in r.aiter_lines():
                            if not line:
                                continue
                            ev = json.loads(line)
                            kind, obj = ev["type"], ev["object"]
                            if kind == "ERROR":
                                if obj.get("code") == 410:
                                    counts.expired += 1
                                    version = ""
                                else:
                                    counts.error(f"ERROR event {obj.get('code')}: {obj.get('message')}")
                                break
                            version = obj["metadata"]["resourceVersion"]
                            if kind == "BOOKMARK":
                                counts.bookmarks += 1
                                continue
                            counts.events += 1
                            if obj.get("spec", {}).get("nodeName") != node:
                                counts.misdelivered += 1
                            sent = (obj["metadata"].get("annotations") or {}).get(LATENCY_ANNOTATION)
                            if kind == "MODIFIED" and sent:
                                counts.latencies.append(time.monotonic() - float(sent))
                    finally:
                        counts.watching_now -= 1
            finally:
                if first:  # the first attempt failed before its watch was answered
                    gate.release()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - counted and retried, as the agent does
            counts.error(f"{node}: {type(exc).__name__}: {exc}")
            version = ""
            await asyncio.sleep(2.0)  # the agent's retry_s


async def churn(http, nodes: int, per_s: float, stop: asyncio.Event, counts: Counts) -> int:
    """Change the pod annotation of one random node of the first ``nodes`` ``per_s`` times a second
    (a cap, a rollout); the other nodes are quiet."""
    sent = 0
    rng = random.Random(7)
    period = 1.0 / per_s
    nxt = time.monotonic()
    while not stop.is_set():
        i = rng.randrange(nodes)
        body = {"metadata": {"annotations": {LATENCY_ANNOTATION: repr(time.monotonic())}}}
        try:
            r = await http.patch(f"/api/v1/namespaces/default/pods/w-{i}", json=body,
                                 headers={"Content-Type": "application/merge-patch+json"})
            r.raise_for_status()
            sent += 1
        except Exception as exc:  # noqa: BLE001
            counts.error(f"patch w-{i}: {type(exc).__name__}: {exc}")
        nxt += period
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
    return sent


async def watching_by_server(http) -> int | None:
    r = await http.get("/metrics")
    if r.status_code != 200:
        return None
    total = 0.0
    for line in r.text.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'resource="pods"' in line and 'verb="WATCH"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def seed(http, nodes: int) -> float:
    t0 = time.monotonic()
    gate = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with gate:
            r = await http.post("/api/v1/namespaces/default/pods", json=_pod(i))
            if r.status_code not in (201, 409):
                raise RuntimeError(f"seeding pod {i}: {r.status_code} {r.text[:200]}")

    await asyncio.gather(*(one(i) for i in range(nodes)))
    return time.monotonic() - t0


def _client_process(index: int, url: str, certs: tuple[str, str, str], first: int, count: int, bookmarks: bool,
                    fixed_timeout_s: int | None, open_at_once: int, reports, stop) -> None:
    """One client process: agents ``first`` .. ``first + count - 1``, their counts sent to ``reports``."""
    asyncio.run(_clients(index, url, certs, first, count, bookmarks, fixed_timeout_s, open_at_once, reports, stop))


async def _clients(index: int, url: str, certs: tuple[str, str, str], first: int, count: int, bookmarks: bool,
                   fixed_timeout_s: int | None, open_at_once: int, reports, stop) -> None:
    connect = _client(url, certs)
    rng = random.Random(index)

    def timeout_s() -> int:  # as agent/podcache.py's next_watch_timeout_s
        return fixed_timeout_s if fixed_timeout_s else rng.randrange(WATCH_MIN_S, 2 * WATCH_MIN_S)

    counts, done, opened = Counts(agents=count), asyncio.Event(), asyncio.Event()
    gate = asyncio.Semaphore(open_at_once)
    tasks = [asyncio.create_task(agent(connect, _node(first + i), bookmarks, timeout_s, counts, gate, opened, done))
             for i in range(count)]
    while not stop.is_set():
        reports.put((index, counts.snapshot()))
        await asyncio.sleep(REPORT_EVERY_S)
    done.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    reports.put((index, {**counts.snapshot(latencies=True), "final": True}))


async def measure(plane, nodes: int, hold_s: float, churn_per_s: float, bookmarks: bool, busy: int,
                  fixed_timeout_s: int | None, procs: int) -> dict:
    pki = plane.pki
    certs = (str(pki.ca_crt), str(pki.admin_crt), str(pki.admin_key))
    api_pid = plane.procs["kube-apiserver"].popen.pid
    connect = _client(plane.url, certs)
    async with connect() as http:
        say(f"seeding {nodes:,} pods (one 8-GPU pod a node)")
        seed_s = await seed(http, nodes)
        say(f"seeded in {seed_s:.1f}s")
        out: dict = {"nodes": nodes, "bookmarks": bookmarks, "hold_s": hold_s, "churn_per_s": churn_per_s, "busy_nodes": busy,
                     "watch_timeout_s": fixed_timeout_s or f"drawn in [{WATCH_MIN_S}, {2 * WATCH_MIN_S})",
                     "client_processes": procs, "seed_s": round(seed_s, 1), "apiserver_rss_mb_idle": round(_rss_mb(api_pid))}
        ctx = multiprocessing.get_context("spawn")
        reports, stop = ctx.Queue(), ctx.Event()
        bounds = [nodes * k // procs for k in range(procs + 1)]
        children = [ctx.Process(target=_client_process, daemon=True, name=f"scale-watch-client-{k}",
                                args=(k, plane.url, certs, bounds[k], bounds[k + 1] - bounds[k], bookmarks,
                                      fixed_timeout_s, max(1, OPEN_AT_ONCE // procs), reports, stop))
                    for k in range(procs)]
        snaps: dict[int, dict] = {}

        def drain() -> dict:
            while True:
                try:
                    k, snap = reports.get_nowait()
                except queue.Empty:
                    return _total(snaps)
                snaps[k] = snap

        def clients_cpu() -> float:
            return sum(_cpu_s(c.pid) for c in children if c.pid and c.is_alive())

        load0 = os.getloadavg()[0]
        cpu0, t0 = _cpu_s(api_pid), time.monotonic()
        for c in children:
            c.start()
        said = t0
        while (now := drain())["opened"] < nodes:
            await asyncio.sleep(0.5)
            if time.monotonic() - said >= 10:
                said = time.monotonic()
                say(f"watches answered: {now['opened']:,}/{nodes:,} ({now['errors']} errors)")
            if not all(c.is_alive() for c in children):
                raise RuntimeError("a client process died while opening its watches")
        open_s = time.monotonic() - t0
        out.update(open_s=round(open_s, 1), open_apiserver_cpu_s=round(_cpu_s(api_pid) - cpu0, 1),
                   open_client_cpu_s=round(clients_cpu(), 1))
        say(f"all {nodes:,} watches open in {open_s:.1f}s; holding {hold_s:.0f}s with {churn_per_s:g} pod changes/s")
        before = drain()
        cpu1, mine1, t1 = _cpu_s(api_pid), clients_cpu(), time.monotonic()
        churn_counts, churn_stop = Counts(), asyncio.Event()
        churner = asyncio.create_task(churn(http, busy, churn_per_s, churn_stop, churn_counts))
        peak_rss = 0.0
        while time.monotonic() - t1 < hold_s:
            await asyncio.sleep(min(10.0, hold_s - (time.monotonic() - t1)))
            peak_rss = max(peak_rss, _rss_mb(api_pid))
            now = drain()
            say(f"+{time.monotonic() - t1:.0f}s: {now['watching_now']:,} watching, lists {now['lists']:,}, "
                f"watches {now['watches']:,}, expired {now['expired']:,}, bookmarks {now['bookmarks']:,}, "
                f"events {now['events']:,}, errors {now['errors']}")
        watching = await watching_by_server(http)
        end = drain()  # the counts as of the last report (at most REPORT_EVERY_S old)
        span = time.monotonic() - t1
        api_cpu, client_cpu = _cpu_s(api_pid) - cpu1, clients_cpu() - mine1
        stop.set()
        churn_stop.set()
        patched = await churner
        deadline = time.monotonic() + 120
        while not all(snaps.get(k, {}).get("final") for k in range(procs)) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            drain()
        for c in children:
            c.join(timeout=10)
            if c.is_alive():
                c.kill()
        lat = [x for snap in snaps.values() for x in snap.get("latencies", [])]
        final = _total(snaps)
        errors = final["errors"] + churn_counts.errors
        out.update(
            apiserver_rss_mb_watching=round(peak_rss), apiserver_cpu_per_s=round(api_cpu / span, 3),
            client_cpu_per_s=round(client_cpu / span, 3), load_avg=[round(load0, 1), round(os.getloadavg()[0], 1)],
            watching_by_server=watching,
            per_s={k: round((end[k] - before[k]) / span, 1) for k in ("lists", "watches", "expired")},
            bookmark_events=final["bookmarks"], events=final["events"], patched=patched, delivered=len(lat),
            latency_s={"p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99), "max": max(lat) if lat else None},
            misdelivered=final["misdelivered"], errors=errors,
            first_error=final["first_error"] or churn_counts.first_error)
        for k in ("p50", "p99", "max"):
            if out["latency_s"][k] is not None:
                out["latency_s"][k] = round(out["latency_s"][k], 3)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See docs/benchmarks.md (issue 36) for recorded figures.")
    ap.add_argument("--nodes", type=int, default=10_000, help="agents, one node each (default 10000)")
    ap.add_argument("--hold-s", type=float, default=150.0,
                    help="seconds to hold every watch open once all are (default 150: past the watch cache's 75 s of history)")
    ap.add_argument("--churn", type=float, default=20.0, help="pod annotation changes a second, on random nodes (default 20)")
    ap.add_argument("--busy-nodes", type=int, default=0,
                    help="the changes land on the first K nodes only (default 0: on any node)")
    ap.add_argument("--bookmarks", action=argparse.BooleanOptionalAction, default=True,
                    help="ask for watch bookmarks, as the agent does (default: on)")
    ap.add_argument("--watch-timeout", default="drawn", metavar="drawn|S",
                    help=f"each watch's server timeout: 'drawn' in [{WATCH_MIN_S}, {2 * WATCH_MIN_S}) s per watch, "
                         "as the agent draws it (default), or a fixed number of seconds (30: the agent before)")
    ap.add_argument("--procs", type=int, default=2, help="client processes the agents are split over (default 2)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = ap.parse_args(argv)
    if args.watch_timeout == "drawn":
        fixed = None
    elif args.watch_timeout.isdigit() and int(args.watch_timeout) > 0:
        fixed = int(args.watch_timeout)
    else:
        ap.error(f"--watch-timeout: 'drawn' or a whole number of seconds above 0, not {args.watch_timeout!r}")
    if args.procs < 1 or args.nodes < args.procs:
        ap.error(f"--procs: between 1 and --nodes ({args.nodes}), not {args.procs}")

    from powerfleet.testing.controlplane import ControlPlane, built_bin_dir

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one socket per agent, and the server inherits it
    if args.nodes + 200 > hard:
        print(f"scale_watch: {args.nodes} agents need {args.nodes + 200} file descriptors; the limit is {hard}",
              file=sys.stderr)
        return 2
    bin_dir = built_bin_dir()
    if bin_dir is None:
        print("scale_watch: no control-plane binaries in the cache: run `make control-plane` first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(bin_dir, Path(tmp))
        try:
            plane.start()
            out = asyncio.run(measure(plane, args.nodes, args.hold_s, args.churn, args.bookmarks,
                                      min(args.busy_nodes or args.nodes, args.nodes), fixed, args.procs))
        finally:
            plane.stop()
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))
    return 0 if out["errors"] == 0 and out["misdelivered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
