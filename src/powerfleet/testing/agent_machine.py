"""A seeded state machine over the node agent's caps (issue 32): what a real node does to it.

Steps: pods created (opted in with a valid or invalid value, or not), given processes, given
the kubelet's allocation (PodResources protobuf shapes, UUID or index IDs), finishing
(``Succeeded``: the kubelet keeps listing the allocation) or deleted; passes; agent restarts,
with and without a SIGKILL between a set and the save after it; GPU re-enumerations; driver
faults (pynvml's own classes from the simulated driver); an API server outage; a host process
on a GPU (an unknown owner); an MPS server on a GPU, whose clients the driver lists or cannot
list (then only the server shows, and only the kubelet's allocation names the clients).

Invariants after every step, for each GPU the last complete pass met without an error:

1. every GPU whose visible pods (a process or an allocation) opted in with valid values is at
   or below the lowest of those values (clamped into the card's range);
2. a GPU with no live opted-in pod and no process of an unknown owner at the last complete pass
   is not capped by powerfleet: it is at its default (the model never sets a limit out of band);
3. a GPU with no live opted-in pod but a process of an unknown owner (a host process, an MPS
   server whose clients neither the driver nor an allocation names) is at or below the safe
   default: safe by default.

``tests/agent/test_caps_machine.py`` runs it bounded; ``bench/agent_explore.py`` runs it long.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.podresources import api_pb2, gpu_allocations
from powerfleet.agent.reconcile import NodeAgent, PassReport
from powerfleet.agent.simulated import SimDevice, SimulatedGpus, write_proc_entry
from powerfleet.agent.state import StateStore
from powerfleet.clock import FakeClock
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo

GPUS = 3
MIN_W, DEFAULT_W = 200, 700
SAFE_W = 500  # the agent's safe_default_watts, inside the card's range
CAPS = ("250", "300", "450", "600", "900", "lots", None)  # 900: clamped to 700; lots: invalid
HOST_PID, SERVER_PID = 50, 60  # a host process (outside Kubernetes); nvidia-cuda-mps-server (a host service)


class Killed(BaseException):
    """SIGKILL between a set and what follows it: nothing more of the pass runs."""


@dataclass
class Pod:
    name: str
    uid: str
    gpu: str  # the UUID it runs on
    cap: str | None
    pid: int
    running: bool = True  # False: Succeeded
    process: bool = False
    allocated: bool = False
    by_index: bool = False  # the allocation's device ID is the GPU's index (deviceIDStrategy=index)

    def valid_w(self) -> int | None:
        try:
            return None if self.cap is None else min(max(int(self.cap), MIN_W), DEFAULT_W)
        except ValueError:
            return None


@dataclass
class Seen:
    """What the last complete pass met: per GPU UUID, the live pods on it then."""

    pods: dict[str, list[Pod]] = field(default_factory=dict)
    report: PassReport | None = None
    unknown: set[str] = field(default_factory=set)  # GPUs with a process of an unknown owner then
    hidden: set[str] = field(default_factory=set)  # GPUs whose MPS clients the driver did not list then


def _device(i: int) -> dict[str, Any]:
    return {"index": i, "uuid": f"GPU-{i:04d}", "min_w": MIN_W, "max_w": DEFAULT_W, "default_w": DEFAULT_W,
            "current_w": DEFAULT_W}


class CapsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        shm = Path("/dev/shm")  # tmpfs where there is one: the record's fsyncs cost nothing there
        self.tmp = Path(tempfile.mkdtemp(prefix="caps-machine-", dir=shm if shm.is_dir() else None))
        (self.tmp / "proc" / "1").mkdir(parents=True)
        (self.tmp / "proc" / "1" / "cgroup").write_text("0::/init.scope\n")
        write_proc_entry(self.tmp / "proc", HOST_PID, None, program="/usr/bin/someones-tool")
        write_proc_entry(self.tmp / "proc", SERVER_PID, None, program="/usr/bin/nvidia-cuda-mps-server")
        self.host: set[str] = set()  # GPU UUIDs a host process runs on
        self.mps: dict[str, bool] = {}  # GPU UUID -> an MPS server runs there; its clients listed by the driver?
        self.gpus = SimulatedGpus([_device(i) for i in range(GPUS)])
        self.clock = FakeClock(t=1_700_000_000.0, mono=100.0)
        self.pods: list[Pod] = []
        self.api_down = False
        self.faults: dict[str, str] = {}  # UUID -> fault
        self.seen: Seen | None = None
        self.next_pid = 1000
        self.agent = self._new_agent()

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the node around the agent --

    def _new_agent(self) -> NodeAgent:
        """A fresh agent from the state on disk; its startup pass may be killed too (then another)."""
        self.seen = None
        while True:
            agent = NodeAgent("node-a", open_gpus=lambda: self.gpus, list_pods=self._list_pods,
                              proc_root=self.tmp / "proc", state=StateStore(self.tmp / "state"), clock=self.clock,
                              safe_default_watts=SAFE_W, metrics=AgentMetrics(CollectorRegistry()),
                              allocations=self._allocations)
            try:
                agent.start()
                return agent
            except Killed:
                self._disarm()

    def _disarm(self) -> None:
        vars(self.gpus).pop("set_limit", None)

    def _list_pods(self) -> list[PodInfo]:
        if self.api_down:
            raise RuntimeError("apiserver down")
        return [PodInfo(name=p.name, namespace="default", uid=p.uid, node_name="node-a",
                        phase="Running" if p.running else "Succeeded",
                        annotations={} if p.cap is None else {POWER_ANNOTATION: p.cap}) for p in self.pods]

    def _index_of(self, uuid: str) -> int:
        return next(d.index for d in self.gpus.devices() if d.uuid == uuid)

    def _allocations(self) -> dict[str, Any]:
        resp = api_pb2.ListPodResourcesResponse()
        for p in self.pods:
            if p.allocated:
                device = str(self._index_of(p.gpu)) if p.by_index else p.gpu
                c = resp.pod_resources.add(name=p.name, namespace="default").containers.add(name="main")
                c.devices.add(resource_name="nvidia.com/gpu", device_ids=[device])
        return gpu_allocations(resp)

    def _sync_pids(self) -> None:
        def change(devs: list[SimDevice]) -> None:
            for d in devs:
                clients = sorted(p.pid for p in self.pods if p.process and p.gpu == d.uuid)
                listed = self.mps.get(d.uuid)
                host = [HOST_PID] if d.uuid in self.host else []
                if listed is None:
                    d.pids, d.mps_pids = clients + host, []
                elif listed:
                    d.pids, d.mps_pids = sorted([SERVER_PID, *clients, *host]), clients
                else:  # an older driver: only the server shows, its clients are not listed
                    d.pids, d.mps_pids = sorted([SERVER_PID, *host]), None
                d.fail = [self.faults[d.uuid]] if d.uuid in self.faults else []
        self.gpus.update(change)

    def limit_w(self, uuid: str) -> float:
        return next(d.current_w or 0 for d in self.gpus.devices() if d.uuid == uuid)

    # -- steps --

    @rule(gpu=st.integers(0, GPUS - 1), cap=st.sampled_from(CAPS), process=st.booleans(), allocated=st.booleans(),
          by_index=st.booleans())
    def create_pod(self, gpu: int, cap: str | None, process: bool, allocated: bool, by_index: bool) -> None:
        self.next_pid += 1
        name = f"pod-{self.next_pid}"
        pod = Pod(name, str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name)), f"GPU-{gpu:04d}", cap, self.next_pid,
                  process=process, allocated=allocated, by_index=by_index)
        write_proc_entry(self.tmp / "proc", pod.pid, pod.uid)
        self.pods.append(pod)
        self._sync_pids()

    @precondition(lambda self: self.pods)
    @rule(i=st.integers(0, 20))
    def toggle_process(self, i: int) -> None:
        p = self.pods[i % len(self.pods)]
        p.process = p.running and not p.process
        self._sync_pids()

    @precondition(lambda self: self.pods)
    @rule(i=st.integers(0, 20))
    def finish_pod(self, i: int) -> None:
        p = self.pods[i % len(self.pods)]
        p.running, p.process = False, False  # the kubelet still lists its allocation
        self._sync_pids()

    @precondition(lambda self: self.pods)
    @rule(i=st.integers(0, 20))
    def delete_pod(self, i: int) -> None:
        self.pods.pop(i % len(self.pods))
        self._sync_pids()

    @rule()
    def run_pass(self) -> None:
        try:
            report = self.agent.run_pass()
        except Killed:  # the armed kill fired right after a set: the next agent starts from disk
            self._disarm()
            self.agent = self._new_agent()
            return
        if report.skipped is None:
            on = {f"GPU-{i:04d}": [replace(p) for p in self.pods if p.running and p.gpu == f"GPU-{i:04d}"]
                  for i in range(GPUS)}  # copies: later steps change the pods
            hidden = {u for u, listed in self.mps.items() if not listed}
            unknown = self.host | {u for u in hidden if not any(p.allocated for p in on[u])}
            self.seen = Seen(on, report, unknown, hidden)

    @rule(kill=st.booleans())
    def restart(self, kill: bool) -> None:
        """A clean restart, or a SIGKILL armed for right after the next set any pass makes."""
        if not kill:
            self.agent.shutdown()
            self.agent = self._new_agent()
        elif "set_limit" not in vars(self.gpus):
            real = self.gpus.set_limit

            def set_then_die(index: int, milliwatts: int, **kw: Any) -> None:
                real(index, milliwatts, **kw)
                raise Killed()
            self.gpus.set_limit = set_then_die  # type: ignore[method-assign]

    @rule(a=st.integers(0, GPUS - 1), b=st.integers(0, GPUS - 1))
    def reenumerate(self, a: int, b: int) -> None:
        def swap(devs: list[SimDevice]) -> None:
            da, db = devs[a].model_dump(), devs[b].model_dump()
            devs[a], devs[b] = SimDevice(**{**db, "index": a}), SimDevice(**{**da, "index": b})
        self.gpus.update(swap)

    @rule(gpu=st.integers(0, GPUS - 1), fault=st.sampled_from(["gpu_lost", "set_not_supported", "uninitialized",
                                                                "malformed", None]))
    def driver_fault(self, gpu: int, fault: str | None) -> None:
        uuid = f"GPU-{gpu:04d}"
        if fault is None:
            self.faults.pop(uuid, None)
        else:
            self.faults[uuid] = fault
        self._sync_pids()

    @rule(down=st.booleans())
    def api_server(self, down: bool) -> None:
        self.api_down = down

    @rule(gpu=st.integers(0, GPUS - 1), on=st.booleans())
    def host_process(self, gpu: int, on: bool) -> None:
        (self.host.add if on else self.host.discard)(f"GPU-{gpu:04d}")
        self._sync_pids()

    @rule(gpu=st.integers(0, GPUS - 1), listed=st.sampled_from([None, True, False]))
    def mps_server(self, gpu: int, listed: bool | None) -> None:
        """An MPS server on the GPU (None: none), its clients listed by the driver or not."""
        if listed is None:
            self.mps.pop(f"GPU-{gpu:04d}", None)
        else:
            self.mps[f"GPU-{gpu:04d}"] = listed
        self._sync_pids()

    # -- invariants --

    def _met(self) -> dict[str, list[Pod]]:
        """The GPUs the last complete pass enforced without an error, with the pods on them then."""
        if self.seen is None or self.seen.report is None:
            return {}
        clean = {g.uuid for g in self.seen.report.gpus if g.uuid and not g.error}
        return {u: pods for u, pods in self.seen.pods.items() if u in clean}

    @invariant()
    def opted_in_gpus_are_at_or_below_their_lowest_valid_cap(self) -> None:
        assert self.seen is not None or not self._met()
        for uuid, pods in self._met().items():
            hidden = self.seen is not None and uuid in self.seen.hidden
            visible = [p for p in pods if (p.process and not hidden) or p.allocated]
            valid = [w for p in visible if (w := p.valid_w()) is not None]
            if valid:
                assert self.limit_w(uuid) <= min(valid), (uuid, self.limit_w(uuid), visible, self.seen)

    @invariant()
    def a_gpu_without_an_opted_in_pod_is_not_capped_unless_an_unknown_owner_uses_it(self) -> None:
        for uuid, pods in self._met().items():
            if any(p.cap is not None for p in pods):
                continue
            assert self.seen is not None
            if uuid in self.seen.unknown:
                assert self.limit_w(uuid) <= SAFE_W, (uuid, self.limit_w(uuid), pods, self.seen)
            else:
                assert self.limit_w(uuid) == DEFAULT_W, (uuid, self.limit_w(uuid), pods, self.seen)
