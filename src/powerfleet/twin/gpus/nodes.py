"""A twin GPU node: its simulated GPUs (shared with its agent) and its proc root.

Per node the twin keeps two things on disk, under the twin's directory:

* ``gpus/<node>.json``: the node's GPUs in the simulated backend's file format
  (``powerfleet.agent.simulated``): limits, the PIDs running on each GPU, the measured draw.
  The agent worker of that node opens the same file (``SimulatedGpus.shared``) and sets
  limits; the twin moves PIDs and draw. Both sides read-modify-write under the file's lock.
* ``proc/<node>/<pid>/cgroup``: one entry per process of every running pod on the node, a
  cgroup v2 systemd path carrying the pod UID (what kubelet and containerd produce), plus
  one system process outside Kubernetes that the agent must skip.
* ``proc/all/<pid>``: a link to every node's pod processes (PIDs are unique across the twin:
  each node has its own range), so agents started with one shared setting (``powerfleet
  up``) can all use ``proc/all``: an agent looks up only the PIDs on its own GPUs.

A pod's processes start when it is Running on this node and end when it is gone: one process
per GPU the pod was given (annotation ``twin.powerfleet.io/gpus``), one for a pod without GPUs.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerfleet.agent.simulated import SimDevice, SimulatedGpus, write_proc_entry
from powerfleet.twin.cluster.operator import pod_gpus
from powerfleet.twin.cluster.topology import GPU_DEFAULT_W, GPU_MAX_W, GPU_MIN_W, gpu_uuid

SYSTEM_PID = 812  # nvidia-persistenced: a process outside Kubernetes
PIDS_PER_NODE = 60_000  # 64 ranges of 60,000 from 10,000 stay under Linux's pid_max (4,194,304)


def pid_base(node_index: int) -> int:
    return 10_000 + node_index * PIDS_PER_NODE


@dataclass(frozen=True)
class GpuSample:
    node: str
    index: int
    uuid: str
    cap_w: float
    draw_w: float
    pod: str | None
    role: str | None
    capped: bool


@dataclass
class NodeSim:
    name: str
    gpus: int
    root: Path
    seed: int = 0
    _pids: dict[tuple[str, int], int] = field(default_factory=dict)  # (pod uid, gpu index or -1) -> pid
    first_pid: int = pid_base(0)
    # The node's power telemetry is lost (NVML's power reading fails; the oversubscription demo's
    # fault): the file carries no draw, so the agent reports none. The samples keep the true draw.
    telemetry_lost: bool = False

    def __post_init__(self) -> None:
        self._next_pid = self.first_pid
        self.gpu_file = self.root / "gpus" / f"{self.name}.json"
        self.proc_root = self.root / "proc" / self.name
        self.proc_root.mkdir(parents=True, exist_ok=True)
        self.shared_proc = self.root / "proc" / "all"
        self.shared_proc.mkdir(parents=True, exist_ok=True)
        devices = [SimDevice(index=i, uuid=gpu_uuid(self.name, i, self.seed), min_w=GPU_MIN_W, max_w=GPU_MAX_W,
                             default_w=GPU_DEFAULT_W) for i in range(self.gpus)]
        self.backend = SimulatedGpus.shared(self.gpu_file, devices)
        d = self.proc_root / str(SYSTEM_PID)
        d.mkdir(exist_ok=True)
        (d / "cgroup").write_text("0::/system.slice/nvidia-persistenced.service\n")

    def _pid(self, uid: str, gpu: int) -> int:
        key = (uid, gpu)
        if key not in self._pids:
            self._pids[key] = self._next_pid
            self._next_pid += 1
        return self._pids[key]

    def tick(self, pods: Sequence[Mapping[str, Any]],
             draw: Callable[[int, float, Mapping[str, Any] | None], tuple[float, bool]]) -> list[GpuSample]:
        """Sync processes with the running ``pods`` on this node, then set each GPU's draw.

        ``draw(index, cap_w, pod_or_None) -> (draw_w, capped)``; one locked read-modify-write
        of the GPU file per tick, so the agent's limit writes are never lost.
        """
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        on_gpu: dict[int, Mapping[str, Any]] = {}
        live: set[tuple[str, int]] = set()
        for p in running:
            uid = p["metadata"]["uid"]
            container = hashlib.sha256(f"{uid}/main".encode()).hexdigest()
            indexes = pod_gpus(p) or [-1]
            for gpu in indexes:
                key = (uid, gpu)
                new = key not in self._pids
                pid = self._pid(uid, gpu)
                live.add(key)
                if new:
                    write_proc_entry(self.proc_root, pid, uid, qos="burstable", container=container)
                    link = self.shared_proc / str(pid)
                    link.unlink(missing_ok=True)
                    link.symlink_to(Path("..") / self.name / str(pid))
                if gpu >= 0:
                    on_gpu[gpu] = p
        for key in [k for k in self._pids if k not in live]:
            pid = self._pids.pop(key)
            (self.shared_proc / str(pid)).unlink(missing_ok=True)
            shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)
        samples: list[GpuSample] = []

        def change(devices: list[SimDevice]) -> None:
            for dev in devices:
                pod = on_gpu.get(dev.index)
                dev.pids = [self._pids[(pod["metadata"]["uid"], dev.index)]] if pod is not None else []
                cap = float(dev.current_w or dev.default_w)
                w, capped = draw(dev.index, cap, pod)
                dev.draw_w = None if self.telemetry_lost else round(w, 1)
                samples.append(GpuSample(self.name, dev.index, dev.uuid, cap, round(w, 1),
                                         pod["metadata"]["name"] if pod is not None else None,
                                         _role(pod), capped))

        self.backend.update(change)
        return samples


def _role(pod: Mapping[str, Any] | None) -> str | None:
    if pod is None:
        return None
    from powerfleet.cluster.dgd import LABEL_COMPONENT

    return str((pod["metadata"].get("labels") or {}).get(LABEL_COMPONENT, "worker"))
