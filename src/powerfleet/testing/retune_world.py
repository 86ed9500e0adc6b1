"""A small retune world (tests, bench/load.py): a DGD with frontend pods, loopback frontends, traffic.

Everything is real except the time: the loopback API server (official client), loopback
frontends (HTTP), a real Redis, and gzip trace segments as frontends write them. The objects go
wherever ``World.api`` seeds them: the loopback server, or the real one
(``powerfleet.testing.controlplane.objects.RealObjects``, the control_plane tier).
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME
from powerfleet.retune.premises import ROUTER_URL_ANNOTATION
from powerfleet.twin.apiserver import ApiServer
from powerfleet.twin.serving.frontend import LoopbackFrontend

INTERVAL = 60
BASE_K = 29_000_000  # window index of the tests' first window (epoch ~1.74e9 s: closed in real time too)
START_POLICY = {"temperature": 1.0}  # random routing: retune has something to win
GRID = {"temperature": {"choices": [0.0, 1.0]}, "prefill_load_scale": {"choices": [1.0, 4.0]}}


def start_of(k: int) -> float:
    return float(k * INTERVAL)


def dgd_object(name: str, *, frontends: int = 2, workers: int = 4, annotations: dict[str, str] | None = None,
               worker_env: list[dict[str, str]] | None = None, prefill: int | None = None) -> dict[str, Any]:
    """A settled DGD: frontends and ``workers`` aggregated workers, or with ``prefill`` a
    disaggregated one (a ``prefill`` pool of that size and a ``decode`` pool of ``workers``)."""
    def comp(cname: str, ctype: str, replicas: int, env: list[dict[str, str]] | None = None) -> dict[str, Any]:
        main: dict[str, Any] = {"name": "main", "image": "m"}
        if env:
            main["env"] = env
        return {"name": cname, "type": ctype, "replicas": replicas,
                "podTemplate": {"metadata": {}, "spec": {"containers": [main]}}}

    pools = [("worker", workers)] if prefill is None else [("prefill", prefill), ("decode", workers)]
    return {
        # v1beta1: the components list is its form (a real server prunes it from a v1alpha1 object).
        "apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
        "metadata": {"name": name, "namespace": "default", "generation": 1, "annotations": annotations or {}},
        "spec": {"components": [comp("frontend", "frontend", frontends)]
                 + [comp(kind, kind, n, worker_env) for kind, n in pools]},
        "status": {"observedGeneration": 1, "state": "successful",
                   "components": {kind: _settled(name, kind, n) for kind, n in [("frontend", frontends), *pools]}},
    }


def _settled(dgd: str, component: str, replicas: int) -> dict[str, Any]:
    """A component's status as Dynamo's CRD requires it (kind, names, updated replicas), all ready."""
    return {"componentKind": "Deployment", "componentNames": [f"{dgd}-{component}"], "replicas": replicas,
            "updatedReplicas": replicas, "readyReplicas": replicas}


def frontend_pod(dgd: str, pod: str, url: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": "default",
                         "labels": {LABEL_DGD_NAME: dgd, LABEL_COMPONENT: "frontend"},
                         "annotations": {ROUTER_URL_ANNOTATION: url}},
            "spec": {"containers": [{"name": "main", "image": "m"}]}, "status": {"phase": "Running"}}


def traffic_lines(n: int, start_s: float, span_s: float = 55.0, seed: int = 7) -> list[str]:
    """``n`` Mooncake requests in [start_s, start_s + span_s): eight sessions sharing prefixes,
    so where a request is routed matters (random routing, temperature 1, loses cache hits)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sess = rng.randrange(8)
        prefix = [sess * 1000 + j for j in range(rng.randrange(20, 60))]
        tail = [10_000_000 + seed * 100_000 + i * 100 + j for j in range(rng.randrange(1, 20))]
        hashes = prefix + tail
        out.append(json.dumps({"timestamp": round(start_s * 1000 + i * span_s * 1000 / n, 3),
                               "input_length": len(hashes) * 512, "output_length": rng.randrange(2, 60),
                               "hash_ids": hashes}))
    return out


def write_segments(trace_dir: Path, dgd: str, pods: list[str], lines: list[str], *, members: int = 2,
                   tag: str = "seg") -> list[Path]:
    """Frontend segments: lines dealt round-robin to pods, each pod's file ``members`` gzip members."""
    paths = []
    for i, pod in enumerate(pods):
        mine = lines[i::len(pods)]
        d = trace_dir / "segments" / dgd / pod
        d.mkdir(parents=True, exist_ok=True)
        step = max(1, -(-len(mine) // members))
        blob = b"".join(gzip.compress(("\n".join(mine[j:j + step]) + "\n").encode())
                        for j in range(0, len(mine), step))
        p = d / f"{tag}.jsonl.gz"
        p.write_bytes(blob)
        paths.append(p)
    return paths


class Seeds(Protocol):
    def apply(self, obj: dict[str, Any]) -> Any: ...


@dataclass
class World:
    api: ApiServer | Seeds
    trace_dir: Path
    kubeconfig: Path
    frontends: dict[str, dict[str, LoopbackFrontend]] = field(default_factory=dict)

    def add_deployment(self, name: str, *, pods: int = 2, policy: dict[str, float] | None = None,
                       **kw: Any) -> dict[str, LoopbackFrontend]:
        fes = {}
        for i in range(pods):
            pod = f"{name}-frontend-{i}"
            fe = LoopbackFrontend(policy if policy is not None else START_POLICY).start()
            self.api.apply(frontend_pod(name, pod, fe.url))
            fes[pod] = fe
        self.api.apply(dgd_object(name, frontends=pods, **kw))
        self.frontends[name] = fes
        return fes

    def stop(self) -> None:
        for fes in self.frontends.values():
            for fe in fes.values():
                fe.stop()


def live_retune_section(world: World, deployments: list[str], **over: Any) -> dict[str, Any]:
    """The ``retune`` section of a fleet config for live tests on ``world``: small windows, the
    noise guard and search rounds off (they are tested on their own), short Leases."""
    section: dict[str, Any] = {
        "deployments": deployments, "window_interval_s": INTERVAL, "trace_dir": str(world.trace_dir),
        "kubeconfig": str(world.kubeconfig), "grid": GRID, "objective": "ttft", "min_improvement_percentage": 0.0,
        "max_shards": 2, "min_requests": 0, "confidence": 0.0, "dwell_s": 0, "search_rounds": 0,
        "time_budget_s": 50, "shard_timeout_s": 40, "lease_duration_s": 30, "lease_renew_s": 5}
    section.update(over)
    return section
