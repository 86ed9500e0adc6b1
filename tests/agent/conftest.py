"""A node on the bench: simulated GPUs, a fake /proc, a pod list, a NodeAgent over them."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.reconcile import NodeAgent
from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.agent.state import StateStore
from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo


def device(index: int, *, current_w: float = 700, pids: list[int] | None = None, **kw: Any) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index:04d}", "min_w": 200, "max_w": 700, "default_w": 700,
            "current_w": current_w, "pids": pids or [], **kw}


@dataclass
class Bench:
    tmp: Path
    gpus: SimulatedGpus
    pods: list[PodInfo] = field(default_factory=list)
    list_error: Exception | None = None
    metrics: AgentMetrics = field(default_factory=lambda: AgentMetrics(CollectorRegistry()))
    clock: FakeClock = field(default_factory=lambda: FakeClock(t=1_700_000_000.0, mono=100.0))
    safe_default: int = 500
    opened: int = 0

    @property
    def proc(self) -> Path:
        return self.tmp / "proc"

    @property
    def state(self) -> StateStore:
        return StateStore(self.tmp / "state")

    def pod(self, name: str, cap: str | None, *, pids: tuple[int, ...] = (), qos: str = "burstable") -> str:
        uid = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name))
        self.pods.append(PodInfo(name=name, namespace="default", uid=uid, node_name="node-a", phase="Running",
                                 annotations={} if cap is None else {POWER_ANNOTATION: cap}))
        for pid in pids:
            write_proc_entry(self.proc, pid, uid, qos=qos)
        return uid

    def list_pods(self) -> list[PodInfo]:
        if self.list_error is not None:
            raise self.list_error
        return list(self.pods)

    def open_gpus(self) -> SimulatedGpus:
        self.opened += 1
        return self.gpus

    def agent(self) -> NodeAgent:
        return NodeAgent("node-a", open_gpus=self.open_gpus, list_pods=self.list_pods, proc_root=self.proc,
                         state=self.state, clock=self.clock, safe_default_watts=self.safe_default,
                         metrics=self.metrics)

    def limits(self) -> list[float]:
        return [d.current_w or 0 for d in self.gpus.devices()]

    def set_pids(self, index: int, pids: list[int]) -> None:
        def change(devs: list[Any]) -> None:
            devs[index].pids = pids
        self.gpus.update(change)


def host_process(proc_root: Path, pid: int = 1) -> None:
    """A host process (init) under a fake proc root, so the root "shows the host's processes"."""
    (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc_root / str(pid) / "cgroup").write_text("0::/init.scope\n")


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    host_process(tmp_path / "proc")
    return Bench(tmp=tmp_path, gpus=SimulatedGpus([device(0), device(1)]))
