"""The digital twin, assembled: API server, operator, GPU nodes, frontends, traffic and power.

``Twin(options).start()`` seeds the loopback API server (nodes in two racks, the two DGDs),
starts the operator loop (through the official client, like any controller), and a tick
thread that once per ``tick_s``: syncs each node's processes and GPUs with the running pods,
starts a ``TwinFrontend`` per running frontend pod (its router URL written on the pod as
``powerfleet.nvidia.com/router-url``), replays the traffic due to each deployment's frontends,
turns the load into per-GPU draw under each GPU's current cap, closes retune windows, and
records a ``Sample``. ``samples`` and ``windows`` are what the live view and report read.

Everything lives under one directory (``root``): ``kubeconfig``, ``gpus/``, ``proc/``,
``traces/segments/`` and ``twin.json`` (the paths and URLs other processes need).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from powerfleet.clock import Clock, SystemClock
from powerfleet.cluster.dgd import DGD_API_VERSION, DGD_KIND, LABEL_DGD_NAME, POWER_ANNOTATION
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.fidelity import DEMO_STARTUP_DELAY_S, OperatorSettings
from powerfleet.twin.serving.frontends import TwinFrontend, WindowTtft
from powerfleet.twin.cluster.kubelet import terminating
from powerfleet.twin.cluster.manifests import dgd_manifests
from powerfleet.twin.gpus.nodes import GpuSample, NodeSim, pid_base
from powerfleet.twin.cluster.operator import pod_gpus
from powerfleet.twin.cluster.planner import StandInPlanner
from powerfleet.twin.gpus.podresources import PodResourcesServers
from powerfleet.twin.gpus.power import gpu_power
from powerfleet.twin.serving.load import window_inputs, worker_loads
from powerfleet.twin.cluster.roles import component_roles, pod_role
from powerfleet.twin.cluster.tenants import tenant_loads, tenant_pods
from powerfleet.twin.cluster.topology import GPU_DEFAULT_W, TwinSpec, gpu_uuid, node_objects
from powerfleet.twin.serving.traffic import DEFAULT_SPEEDUP, TrafficSource, find_traces, load_sources
from powerfleet.twin.cluster.writer import OperatorLoop

log = logging.getLogger(__name__)
# Read by retune's premise checks (powerfleet.retune.premises) to find each frontend's router.
ROUTER_URL_ANNOTATION = "powerfleet.nvidia.com/router-url"
METRICS_URL_ANNOTATION = "powerfleet.nvidia.com/metrics-url"


@dataclass(frozen=True)
class TwinOptions:
    spec: TwinSpec = TwinSpec()
    root: Path = Path("twin")
    speedup: float = DEFAULT_SPEEDUP
    window_s: int = 20
    traces: Path | None = None
    tick_s: float = 1.0
    operator_interval_s: float = 1.0
    # Fraction of each rack's maximum GPU power that is its budget (the report's reference line).
    rack_budget_fraction: float = 0.8
    # Startup delays, grace period, foreign status keys (twin/fidelity.py).
    operator: OperatorSettings = OperatorSettings(startup_delay_s=DEMO_STARTUP_DELAY_S)
    # Pods of deployments the fleet does not manage, on every rack (tenants.py).
    tenants: bool = True
    # A stand-in planner rewriting worker replicas every this many seconds (planner.py); off by
    # default: it reverts the budget's scale-ups, which is the conflict it exists to show.
    planner_period_s: float | None = None
    # A scenario's cluster (twin/demo/scenario_twin.py): the DGDs to seed (None: manifests.dgd_manifests),
    # the tenant pods (None: tenants.tenant_pods when ``tenants``), each tenant pod's load, the
    # racks' limits (a rack absent: the budget rule above) and each deployment's traffic
    # (None: traffic.load_sources).
    manifests: tuple[dict[str, Any], ...] | None = None
    tenant_pods: tuple[dict[str, Any], ...] | None = None
    tenant_load: Mapping[str, float] | None = None
    rack_limit_w: Mapping[str, float] | None = None
    traffic: Any = None  # (spec, seed, speedup) -> (source description, {deployment: TrafficSource})


@dataclass(frozen=True)
class Sample:
    t: float
    fleet_w: float
    rack_w: dict[str, float]
    gpus: list[GpuSample]
    annotated_w: dict[str, float | None]  # "<node>/<index>" -> the cap its pod asks for (None: no pod / no annotation)
    requests: dict[str, int]  # requests served this tick, per deployment
    rack_budget_w: dict[str, float] = field(default_factory=dict)  # each rack's limit at this tick


@dataclass
class Twin:
    options: TwinOptions
    clock: Clock = field(default_factory=SystemClock)
    samples: list[Sample] = field(default_factory=list)
    windows: list[WindowTtft] = field(default_factory=list)
    frontends: dict[str, TwinFrontend] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    traffic_source: str = ""
    tick_errors: int = 0
    last_tick_error: str | None = None
    # The API server: None, the loopback one; else one with its surface on a real control plane
    # (powerfleet.testing.controlplane.twin_api, ``--control-plane real``).
    server: Any = None

    def __post_init__(self) -> None:
        self.root = Path(self.options.root).resolve()
        self.spec = self.options.spec
        self.api = self.server if self.server is not None else ApiServer(clock=self.clock)
        self.nodes: dict[str, NodeSim] = {}
        self.operator: OperatorLoop | None = None
        self.podresources: PodResourcesServers | None = None  # the kubelet's PodResources API per node
        self.sources: dict[str, TrafficSource] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._manifest_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="twin-node")
        self._t0 = 0.0
        self._rng = random.Random(self.spec.seed)
        self._ema: dict[str, tuple[float, float]] = {}  # dgd -> (input tok/s, output tok/s)
        # (dgd, component) -> role (twin/cluster/roles.py), refreshed when a DGD's generation changes
        self._roles: dict[tuple[str, str], str] = {}
        self._roles_of: dict[str, tuple[Any, dict[str, str]]] = {}
        # dgd -> factor on its workers' load (a demand surge; the oversubscription demo's lever)
        self.load_scale: dict[str, float] = {}
        self.kubeconfig = self.root / "kubeconfig"
        self.trace_dir = self.root / "traces"
        self.limit_w: dict[str, float] = dict(self.options.rack_limit_w or {})  # set_limit's lever
        self._tenants = list(self.options.tenant_pods if self.options.tenant_pods is not None
                             else tenant_pods(self.spec) if self.options.tenants else [])
        self.tenant_load: dict[str, float] = dict(self.options.tenant_load or {})

    # -- lifecycle --

    def start(self) -> Twin:
        self.root.mkdir(parents=True, exist_ok=True)
        self.api.start()
        manifests = list(self.options.manifests) if self.options.manifests is not None else dgd_manifests(self.spec)
        for obj in node_objects(self.spec) + manifests + self.tenant_pods:
            self.api.apply(obj)
        self.api.write_kubeconfig(self.kubeconfig, namespace=self.spec.namespace)
        self.nodes = {n: NodeSim(n, self.spec.gpus_of(n), self.root, self.spec.seed, first_pid=pid_base(i))
                      for i, n in enumerate(self.spec.node_names)}
        self.podresources = PodResourcesServers(list(self.nodes), lambda: self.api.list("v1", "Pod", self.spec.namespace),
                                                pod_gpus, lambda n, g: gpu_uuid(n, g, self.spec.seed)).start()
        if self.options.traffic is not None:
            self.traffic_source, self.sources = self.options.traffic(self.spec.seed, self.options.speedup)
        else:
            self.traffic_source, self.sources = load_sources(find_traces(self.options.traces),
                                                             speedup=self.options.speedup, seed=self.spec.seed)
        planner = StandInPlanner(self.options.planner_period_s) if self.options.planner_period_s else None
        self.operator = OperatorLoop(str(self.kubeconfig), self.spec.namespace, clock=self.clock,
                                     settings=self.options.operator, planner=planner)
        self.operator.start(self.options.operator_interval_s)
        self._t0 = self.clock.now()
        self._thread = threading.Thread(target=self._loop, name="twin-tick", daemon=True)
        self._thread.start()
        self.write_manifest()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self.operator is not None:
            self.operator.stop()
        for fe in self.frontends.values():
            fe.stop()
        self._pool.shutdown(wait=True)
        if self.podresources is not None:
            self.podresources.stop()
        self.api.stop()

    def __enter__(self) -> Twin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            # A fixed period (not a fixed pause), so a slow tick does not stretch the time base.
            next_at += self.options.tick_s
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - one bad tick must not stop the twin
                self.tick_errors += 1
                self.last_tick_error = f"{type(exc).__name__}: {exc}"
                log.warning("twin tick failed: %s", self.last_tick_error, exc_info=True)
            next_at = max(next_at, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    # -- what other processes need --

    @property
    def tenant_pods(self) -> list[dict[str, Any]]:
        """The tenant pods seeded at start (a scenario's add_tenant events come later)."""
        return [dict(p) for p in self._tenants]

    @property
    def budgets(self) -> dict[str, float]:
        """Rack budgets (W): a rack's limit where one is set (a scenario's ``limit_w``, set_limit),
        else a fixed fraction of the rack's maximum GPU power plus what the budget ledger charges
        the rack's other tenants bound there at start (their cap, else the card's maximum), so that
        the fleet's own deployments meet the same squeeze with or without tenants beside them."""
        per_gpu = GPU_DEFAULT_W * self.options.rack_budget_fraction
        out = {rack: per_gpu * self.spec.rack_gpus(rack) for rack in self.spec.racks}
        for pod in self._tenants:
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                raw = (pod["metadata"].get("annotations") or {}).get(POWER_ANNOTATION)
                out[self.spec.rack_of(node)] += (int(raw) if raw else GPU_DEFAULT_W) * max(1, len(pod_gpus(pod)))
        with self._lock:
            out.update(self.limit_w)
        return out

    def set_limit(self, rack: str, watts: float) -> None:
        with self._lock:
            self.limit_w[rack] = float(watts)

    def manifest(self) -> dict[str, Any]:
        return {
            "kubeconfig": str(self.kubeconfig), "api_server": self.api.url, "namespace": self.spec.namespace,
            "nodes": {n: {"rack": self.spec.rack_of(n), "gpu_file": str(s.gpu_file), "proc_root": str(s.proc_root)}
                      for n, s in self.nodes.items()},
            "shared_proc_root": str(self.root / "proc" / "all"),
            "podresources_socket": self.podresources.pattern if self.podresources else None,
            "racks": self.spec.racks, "rack_budget_w": self.budgets, "trace_dir": str(self.trace_dir),
            "frontends": {k: {"router_url": f.url, "metrics_url": f.metrics_url, "dgd": f.dgd}
                          for k, f in list(self.frontends.items())},  # a copy: the tick thread adds to it
            "traffic": {"source": self.traffic_source, "speedup": self.options.speedup},
            "window_s": self.options.window_s,
        }

    def write_manifest(self) -> Path:
        """Write twin.json atomically; the tick thread and the command's thread both call this."""
        path = self.root / "twin.json"
        with self._manifest_lock:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.manifest(), indent=1, sort_keys=True))
            tmp.replace(path)
        return path

    # -- one tick --

    def tick(self) -> Sample:
        now = self.clock.now()
        dt = self.options.tick_s
        pods = self.api.list("v1", "Pod", self.spec.namespace)
        self._sync_frontends(pods)
        served: dict[str, int] = {}
        for dgd, source in self.sources.items():
            reqs = source.due(now - self._t0)
            arrivals = [(self._t0 + r.timestamp_ms / 1000.0 / source.speedup, r) for r in reqs]
            fes = [f for f in self.frontends.values() if f.dgd == dgd]
            if not fes:
                self.dropped[dgd] = self.dropped.get(dgd, 0) + len(reqs)
            for i, fe in enumerate(fes):
                fe.serve(arrivals[i::len(fes)], dt)
            served[dgd] = len(reqs) if fes else 0
            isl = sum(r.input_length for r in reqs) / dt if fes else 0.0
            osl = sum(r.output_length for r in reqs) / dt if fes else 0.0
            old = self._ema.get(dgd, (isl, osl))
            a = min(1.0, dt / 3.0)
            self._ema[dgd] = (old[0] + a * (isl - old[0]), old[1] + a * (osl - old[1]))
        self._refresh_roles()
        loads = worker_loads(pods, self.role_of, self._ema, self.load_scale) | tenant_loads(pods) | {
            n: w for n, w in self.tenant_load.items() if any(p["metadata"]["name"] == n for p in pods)}
        samples: list[GpuSample] = []
        annotated: dict[str, float | None] = {}
        by_node: dict[str, list[Mapping[str, Any]]] = {}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node:
                by_node.setdefault(node, []).append(p)
        def draw(index: int, cap: float, pod: Mapping[str, Any] | None) -> tuple[float, bool]:
            role = None if pod is None else self.role_of(pod)
            load = 0.0 if pod is None else loads.get(pod["metadata"]["name"], 0.0)
            gp = gpu_power(role, load, cap, self._rng)
            return gp.draw_w, gp.capped

        # Each node's GPU file is written with an fsync: in parallel, so 64 nodes fit in a tick.
        futures = {name: self._pool.submit(node.tick, by_node.get(name, []), draw) for name, node in self.nodes.items()}
        for name, fut in futures.items():
            node_samples = fut.result()
            samples.extend(node_samples)
            for s in node_samples:
                annotated[f"{s.node}/{s.index}"] = _annotated_cap(by_node.get(name, []), s.pod)
        rack_w: dict[str, float] = {r: 0.0 for r in self.spec.racks}
        for s in samples:
            rack_w[self.spec.rack_of(s.node)] += s.draw_w
        sample = Sample(now, round(sum(rack_w.values()), 1), {k: round(v, 1) for k, v in rack_w.items()},
                        samples, annotated, served, self.budgets)
        self._close_windows(now, pods, samples)
        with self._lock:
            self.samples.append(sample)
        return sample

    def _sync_frontends(self, pods: list[dict[str, Any]]) -> None:
        running = {p["metadata"]["name"]: p for p in pods if self.role_of(p) == "frontend"
                   and (p.get("status") or {}).get("phase") == "Running" and not terminating(p)}
        changed = False
        for name in [n for n in self.frontends if n not in running]:
            self.frontends.pop(name).stop()
            changed = True
        for name, pod in running.items():
            if name in self.frontends:
                continue
            dgd = pod["metadata"]["labels"].get(LABEL_DGD_NAME, "")
            fe = TwinFrontend(dgd, name, self.trace_dir, self.options.window_s, seed=self.spec.seed).start()
            self.frontends[name] = fe
            self._annotate(name, {ROUTER_URL_ANNOTATION: fe.url, METRICS_URL_ANNOTATION: fe.metrics_url})
            changed = True
        if changed:
            self.write_manifest()

    def _annotate(self, pod: str, annotations: dict[str, str]) -> None:
        """The kubelet's own write: the endpoint a started frontend listens on."""
        def write(obj: dict[str, Any]) -> None:
            obj["metadata"].setdefault("annotations", {}).update(annotations)
            obj.setdefault("status", {})["podIP"] = "127.0.0.1"

        self.api.update("v1", "Pod", pod, self.spec.namespace, write)

    def _close_windows(self, now: float, pods: list[dict[str, Any]], gpus: list[GpuSample]) -> None:
        caps: dict[str, list[float]] = {}
        for g in gpus:
            if g.pod is not None:
                caps.setdefault(g.pod, []).append(g.cap_w)
        for fe in list(self.frontends.values()):
            w = window_inputs(fe.dgd, pods, self.role_of, caps)
            done = fe.close_windows(now, w.workers, w.cap_fraction, w.prefill, w.prefill_cap_fraction)
            if done is not None:
                with self._lock:
                    self.windows.append(done)

    def _refresh_roles(self) -> None:
        seen: dict[str, tuple[Any, dict[str, str]]] = {}
        for d in self.api.list(DGD_API_VERSION, DGD_KIND, self.spec.namespace):
            name, gen = d["metadata"]["name"], d["metadata"].get("generation")
            old = self._roles_of.get(name)
            seen[name] = old if old is not None and old[0] == gen else (gen, component_roles(d))
        self._roles_of = seen
        self._roles = {(d, c): r for d, (_, m) in seen.items() for c, r in m.items()}

    def role_of(self, pod: Mapping[str, Any]) -> str:
        return pod_role(pod, self._roles)

    # -- the scenario's levers (what a user would do with kubectl) --

    def set_component_cap(self, dgd: str, component: str, watts: int) -> dict[str, Any]:
        """Change a component's power annotation on the DGD (a template change: the operator rolls pods)."""
        def write(obj: dict[str, Any]) -> None:
            svc = obj["spec"]["services"][component]
            svc.setdefault("extraPodMetadata", {}).setdefault("annotations", {})[POWER_ANNOTATION] = str(watts)

        return dict(self.api.update(DGD_API_VERSION, DGD_KIND, dgd, self.spec.namespace, write))

    def token_rates(self, dgd: str) -> tuple[float, float]:
        """The deployment's served (input, output) tokens per second, smoothed over about 3 s."""
        return self._ema.get(dgd, (0.0, 0.0))

    def snapshot_samples(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def snapshot_windows(self) -> list[WindowTtft]:
        with self._lock:
            return list(self.windows)


def _annotated_cap(pods: list[Mapping[str, Any]], name: str | None) -> float | None:
    if name is None:
        return None
    for p in pods:
        if p["metadata"]["name"] == name:
            raw = (p["metadata"].get("annotations") or {}).get(POWER_ANNOTATION)
            return float(raw) if raw is not None and str(raw).strip().isdigit() else None
    return None


def sample_to_json(s: Sample) -> dict[str, Any]:
    return {"t": s.t, "fleet_w": s.fleet_w, "rack_w": s.rack_w, "requests": s.requests,
            "gpus": [asdict(g) for g in s.gpus]}
