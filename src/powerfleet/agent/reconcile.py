"""One node's reconcile pass: a small program over injected ports.

Ports: the GPU backend (opened lazily, so a node whose NVML is not ready yet retries at the
next pass), a pod lister for this node, the proc root, the state store, the clock, the
metrics, and ``may_actuate`` (None while this agent holds its node's lock and is not
drained, else the reason it may not touch a GPU). ``NodeAgent`` holds what must survive
between passes (the managed set, the targets it set) and is not thread-safe: the runtime
runs one pass at a time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from powerfleet.agent.apply import ApplyFailed, apply_limit
from powerfleet.agent.catalog import card_range, safe_default_mw
from powerfleet.agent.gpu import GpuBackend, GpuError, GpuReading, watts
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.podmap import annotations_by_uid, map_pids, pods_of, proc_root_problem, visible
from powerfleet.agent.policy import Decision, Kind, decide
from powerfleet.agent.lifecycle import NodeLifecycle, one_line as _one_line
from powerfleet.agent.report import GpuOutcome, PassReport
from powerfleet.agent.state import StateStore
from powerfleet.agent.throttle import OverlayStore
from powerfleet.clock import Clock
from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")

PodLister = Callable[[], list[PodInfo]]

__all__ = ["GpuOutcome", "NodeAgent", "PassReport", "PodLister"]


class NodeAgent(NodeLifecycle):
    overlays: OverlayStore | None = None  # the power guard's overlays (agent/throttle.py); set by build

    def __init__(self, node: str, *, open_gpus: Callable[[], GpuBackend], list_pods: PodLister,
                 proc_root: str | os.PathLike[str], state: StateStore, clock: Clock, metrics: AgentMetrics,
                 safe_default_watts: int | None = None, safe_default_fraction: float = 0.7,
                 complete_view: bool = True, may_actuate: Callable[[], str | None] | None = None,
                 allocations: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.node = node
        self._open_gpus = open_gpus
        self._gpus: GpuBackend | None = None
        self._list_pods = list_pods
        self.proc_root = Path(proc_root)
        self.state = state
        self.clock = clock
        self.safe_default_watts = safe_default_watts
        self.safe_default_fraction = safe_default_fraction
        self.complete_view = complete_view  # the pod view covers every namespace (agent.namespaces empty)
        self.may_actuate = may_actuate or (lambda: None)
        self._allocations = allocations  # GPU UUID -> podresources.Allocation (the kubelet's PodResources)
        self._allocation_problem: str | None = None
        self.stopping = threading.Event()  # set by the runtime at shutdown: the pass stops before its next GPU
        self.metrics = metrics
        loaded = state.load()
        self.managed: set[str] = set(loaded.uuids)
        # Inconclusive state: no orphan recovery, and the file is not rewritten before a good pass.
        self.state_conclusive = loaded.conclusive
        self._recovered = not loaded.conclusive
        self._unsaved = False
        self._last_kind: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._noted: set[tuple[str, str]] = set()  # (uuid or index, kind): logged once
        self._targets: dict[str, tuple[int, int]] = {}  # uuid -> (target mW this agent put in force, revision)
        self._revision = int(clock.now() * 1000)  # monotonic across restarts with a sane clock
        self.last_good_mono: float | None = None
        self.last_report: PassReport | None = None
        self.last_pods: dict[str, PodInfo] = {}  # the pod view of the last pass, by UID (evidence)
        self._pids_seen: dict[str, tuple[int, ...]] = {}  # uuid -> pids at the last pass (the process poll)
        self._last_skip: str | None = None
        self.blind: str | None = None
        if not loaded.conclusive:
            log.error("state file unusable (%s): starting without orphan recovery; it is kept until a pass succeeds",
                      loaded.problem)

    # -- ports --

    def gpus(self) -> GpuBackend:
        if self._gpus is None:
            self._gpus = self._open_gpus()
        return self._gpus

    # -- one pass --

    def run_pass(self, trigger: str = "tick", *, dry_run: bool = False) -> PassReport:
        t0 = self.clock.monotonic()
        report = self._pass(trigger, dry_run)
        report.duration_s = max(0.0, self.clock.monotonic() - t0)
        if not dry_run:
            outcome = "skipped" if report.skipped else ("ok" if report.good else "partial")
            self.metrics.passes.labels(trigger=trigger, outcome=outcome).inc()
            self.metrics.pass_duration.observe(report.duration_s)
            if report.good:
                self.last_good_mono = self.clock.monotonic()
                self.metrics.last_good_pass.set(self.clock.now())
            self.last_report = report
        return report

    def _skip(self, trigger: str, dry_run: bool, why: str) -> PassReport:
        if why != self._last_skip:  # one warning per cause, not one per pass
            log.warning("node %s: pass skipped, nothing changed: %s", self.node, why)
            self._last_skip = why
        return PassReport(node=self.node, trigger=trigger, dry_run=dry_run, at=self.clock.now(), duration_s=0.0,
                          skipped=why, managed=sorted(self.managed))

    def _pass(self, trigger: str, dry_run: bool) -> PassReport:
        # Pods first: without a complete list no cap may be computed (fail-safe: change nothing).
        try:
            pods = self._list_pods()
        except Exception as exc:
            if not dry_run:
                self.metrics.pod_list_failures.inc()
            return self._skip(trigger, dry_run, f"pod list failed: {_one_line(exc)}")
        if not dry_run:
            refused = self.may_actuate()
            if refused is not None:  # not the lock holder, or drained: never touch a GPU
                return self._skip(trigger, dry_run, refused)
        try:
            gpus = self.gpus()
            if not self._recovered and not dry_run:
                self._recover(gpus)
            count = gpus.device_count()
        except GpuError as exc:
            return self._skip(trigger, dry_run, f"GPU backend: {_one_line(exc)}")
        if count <= 0:
            return self._skip(trigger, dry_run, "no GPUs found")
        readings: list[GpuReading | GpuOutcome] = [self._read(gpus, i, dry_run) for i in range(count)]
        ok = [r for r in readings if isinstance(r, GpuReading)]
        self._pids_seen = {r.uuid: r.pids for r in ok}
        blind = self._blind_spot([p for r in ok for p in r.pids])
        pid_to_pod = map_pids(self.proc_root, [p for r in ok for p in r.pids])
        annotations = annotations_by_uid(pods)
        by_uid = {p.uid.lower(): p for p in pods if p.uid}
        self.last_pods = by_uid
        allocated = self._allocated_pods(by_uid)
        outcomes = []
        for r in readings:
            if isinstance(r, GpuOutcome):
                outcomes.append(r)
                continue
            if self.stopping.is_set() and not dry_run:
                outcomes.append(GpuOutcome(index=r.index, uuid=r.uuid, pods=[], decision=None, requested_w=None,
                                           cap_w=None, current_w=watts(r.current_mw), action="none",
                                           reason="shutting down"))
                continue
            mapped = [p for p in r.pids if p in pid_to_pod]
            rng = card_range(r.min_mw, r.max_mw, r.name)
            if rng.note:
                self._note(r.uuid, "range", logging.WARNING, f"GPU {r.index} ({r.uuid}): {rng.note}")
            safe = safe_default_mw(rng, fraction=self.safe_default_fraction, override_w=self.safe_default_watts)
            on_gpu = pods_of(mapped, pid_to_pod)
            owner = allocated.get(r.uuid)
            if owner is not None and owner not in on_gpu:
                if r.pids and not dry_run:  # processes, but none of the pod the kubelet gave the GPU to
                    self.metrics.podresources_mismatch.inc()
                on_gpu = sorted(set(on_gpu) | {owner})  # idle, MPS or graphics: capped from its allocation
            decision = decide(on_gpu, annotations, busy=not r.idle or owner is not None, safe_default_mw=safe,
                              unmapped=len(r.pids) - len(mapped), listed=by_uid, complete=self.complete_view)
            outcome = self._enforce(gpus, r, decision, rng.min_mw, rng.max_mw, by_uid, dry_run)
            if not dry_run:
                self._export(outcome)
            outcomes.append(outcome)
        if self._last_skip is not None:
            log.info("node %s: passes run again (were skipped: %s)", self.node, self._last_skip)
            self._last_skip = None
        report = PassReport(node=self.node, trigger=trigger, dry_run=dry_run, at=self.clock.now(), duration_s=0.0,
                            gpus=outcomes, blind=blind)
        if not dry_run:
            if len(ok) == count:
                self.metrics.retire_gpus({r.uuid for r in ok})
            self._persist(report.good)
        report.managed = sorted(self.managed)
        return report

    def _allocated_pods(self, pods: dict[str, PodInfo]) -> dict[str, str]:
        """GPU UUID -> UID of the pod the kubelet allocated it to; {} without PodResources."""
        if self._allocations is None:
            return {}
        try:
            got = self._allocations()
            problem = None
        except Exception as exc:  # PodResourcesUnavailable, or anything from grpc: process mapping only
            got, problem = {}, _one_line(exc)
        if problem != self._allocation_problem:
            if problem:
                log.warning("node %s: no GPU allocations from the kubelet (%s); mapping by process only",
                            self.node, problem)
            else:
                log.info("node %s: GPU allocations from the kubelet's PodResources", self.node)
            self._allocation_problem = problem
        by_name = {(p.namespace, p.name): uid for uid, p in pods.items()}
        return {uuid: by_name[(a.namespace, a.pod)] for uuid, a in got.items() if (a.namespace, a.pod) in by_name}

    def _read(self, gpus: GpuBackend, i: int, dry_run: bool) -> GpuReading | GpuOutcome:
        try:
            return gpus.read(i)
        except GpuError as exc:
            out = GpuOutcome(index=i, uuid=exc.uuid, pods=[], decision=None, requested_w=None, cap_w=None,
                             current_w=None, action="error", error=_one_line(exc), error_kind=exc.kind)
            if dry_run:
                return out
            self.metrics.gpu_errors.labels(kind=exc.kind).inc()
            key = exc.uuid or f"index {i}"
            if exc.kind == "not_supported":
                out.action = "unsupported"  # reported, and left out of readiness: it cannot be capped
                self.metrics.unsupported.labels(str(i), exc.uuid or "", self.node).set(1)
                self._note(key, exc.kind, logging.WARNING,
                           f"GPU {i} ({exc.uuid or '?'}) has no power-limit support; it is left out of readiness")
            else:
                self.metrics.apply_failures.inc()
                self._note(key, exc.kind, logging.ERROR, f"GPU {i}: {_one_line(exc)} (kind {exc.kind})")
            return out

    def _note(self, key: str, kind: str, level: int, message: str) -> None:
        """Log a per-GPU condition once per kind, not once per pass."""
        if (key, kind) not in self._noted:
            self._noted.add((key, kind))
            log.log(level, message)

    def _blind_spot(self, pids: list[int]) -> str | None:
        problem = proc_root_problem(self.proc_root)
        if problem is None and pids and not visible(self.proc_root, pids):
            problem = (f"proc root {self.proc_root} shows none of the {len(set(pids))} GPU process(es) NVML reports; "
                       "mount the host's /proc or use hostPID")
        if problem != self.blind:
            if problem:
                log.error("node %s: %s; caps are kept and the agent is not ready", self.node, problem)
            else:
                log.info("node %s: the proc root shows the GPU processes again", self.node)
            self.blind = problem
        return problem

    def _enforce(self, gpus: GpuBackend, r: GpuReading, d: Decision, min_mw: int, max_mw: int,
                 pods: dict[str, PodInfo], dry_run: bool) -> GpuOutcome:
        out = GpuOutcome(index=r.index, uuid=r.uuid, pods=list(d.pods), decision=d.kind.value, requested_w=None,
                         cap_w=None, current_w=watts(r.current_mw), draw_w=watts(r.draw_mw), action="none",
                         reason=d.reason, min_w=watts(min_mw), max_w=watts(max_mw), unattributed=d.unattributed)
        if not dry_run:
            self._observe(r, d, pods)
        if d.kind in (Kind.IDLE, Kind.HOLD):
            # idle: a worker may come back; hold: processes it cannot attribute keep the cap. What
            # is enforced was read from this GPU at the start of the pass.
            out.enforced_w = watts(r.enforced_mw if r.enforced_mw is not None else r.current_mw)
            return out
        if d.kind is Kind.RELEASE:
            out.requested_w = watts(r.default_mw)
            if r.uuid not in self.managed:
                return out  # not ours: leave whatever limit it has
            target, direction = r.default_mw, None
        else:
            assert d.requested_mw is not None
            out.requested_w = watts(d.requested_mw)
            target = min(max(d.requested_mw, min_mw), max_mw)
            direction = "min" if d.requested_mw < min_mw else ("max" if d.requested_mw > max_mw else None)
            if self.overlays is not None:  # power guard hook: min(annotation cap, overlay), or the safe cap
                target, held = self.overlays.limit_mw(r.uuid, target, min_mw, max_mw)
                out.overlay = held.why if held is not None else None
        out.cap_w, out.clamped = watts(target), direction
        if dry_run:
            out.action = "hold" if r.current_mw == target else "would-set"
            return out
        if direction is not None:
            self.metrics.clamped.labels(direction=direction).inc()
        last = self._targets.get(r.uuid)
        if last is not None and r.uuid in self.managed and r.current_mw != last[0]:
            self.metrics.readback_mismatch.inc()
            log.warning("GPU %d (%s): limit is %s W, not the %s W this agent set (external change?); re-applying",
                        r.index, r.uuid, watts(r.current_mw), watts(last[0]))
        try:
            applied = apply_limit(gpus, r, target, d.kind.value)
        except ApplyFailed as exc:
            self.metrics.apply_failures.inc()
            self.metrics.gpu_errors.labels(kind=exc.kind).inc()
            log.error("GPU %d (%s): %s", r.index, r.uuid, exc)
            out.action, out.error, out.error_kind, out.cap_w = "error", _one_line(exc), exc.kind, None
            out.write, out.readback = ("failed", "skipped") if exc.stage == "write" else ("ok", "failed")
            if exc.kind == "mismatch":
                out.readback = "mismatch"
            return out
        out.action = applied.action
        out.write = "ok" if applied.action == "set" else "skipped"
        out.readback = "match"
        if last is None or last[0] != target:
            self._revision += 1
            last = (target, self._revision)
            self._targets[r.uuid] = last
        out.revision = last[1]
        out.enforced_w = self._enforced(gpus, r, target, applied.action == "set")
        if d.kind is Kind.RELEASE:
            self.managed.discard(r.uuid)
            self._targets.pop(r.uuid, None)
            self._unsaved = True
        elif r.uuid not in self.managed:
            self.managed.add(r.uuid)  # only after the limit is known to hold
            self._unsaved = True
        self.metrics.applied_limit.labels(gpu=str(r.index)).set(applied.cap_mw / 1000)
        return out

    def _enforced(self, gpus: GpuBackend, r: GpuReading, target: int, written: bool) -> int | float | None:
        """The enforced limit after all limiters, read from the same GPU; counted when below the target."""
        try:
            mw = gpus.read_enforced(r.index) if written else r.enforced_mw
        except GpuError:
            mw = None
        if mw is None:
            mw = target  # the driver has no separate enforced read: the read-back limit is what holds
        if mw < target:
            self.metrics.enforced_below.inc()
            self._note(r.uuid, "enforced_below", logging.WARNING,
                       f"GPU {r.index} ({r.uuid}): enforced limit {watts(mw)} W is below the target {watts(target)} W "
                       "(an out-of-band or BMC limit)")
        return watts(mw)

    def _export(self, g: GpuOutcome) -> None:
        """Per-GPU gauges with dcgm-exporter's labels: what is asked, targeted and enforced; a
        gauge whose value is unknown this pass is removed rather than left stale."""
        labels = self.metrics.series_labels(g.uuid or "")
        if labels is None:
            return
        for gauge, value in ((self.metrics.requested, g.requested_w), (self.metrics.target, g.cap_w),
                             (self.metrics.enforced, g.enforced_w)):
            if value is None:
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass
            else:
                gauge.labels(*labels).set(value)
        if g.enforced_w is not None:
            self.metrics.readback_time.labels(*labels).set(self.clock.now())

    def _observe(self, r: GpuReading, d: Decision, pods: dict[str, PodInfo]) -> None:
        """Metrics and logs for a decision; multi-pod and fallback decisions are logged when they change."""
        gpu = str(r.index)
        if d.kind in (Kind.IDLE, Kind.RELEASE, Kind.HOLD):
            self.metrics.applied_limit.labels(gpu=gpu).set(r.current_mw / 1000)
        if r.draw_mw is not None:
            self.metrics.draw.labels(gpu=gpu).set(r.draw_mw / 1000)
        one = pods.get(d.pods[0]) if len(d.pods) == 1 else None
        dl = (gpu, r.uuid, self.node)
        gl = dl + ((one.namespace, one.name, "") if one is not None else ("", "", ""))
        self.metrics.gpu_labels(r.uuid, gl, dl)
        self.metrics.unattributed.labels(*dl).set(d.unattributed)
        if d.kind in (Kind.AGREE, Kind.CONFLICT):
            self.metrics.multi_pod.labels(disposition=d.kind.value).inc()
        if d.uses_safe_default:
            self.metrics.safe_default.inc()
        key = (d.kind.value, d.pods)
        if self._last_kind.get(r.uuid) == key:
            return
        self._last_kind[r.uuid] = key
        if d.kind is Kind.CONFLICT or d.kind is Kind.SAFE_DEFAULT:
            log.error("GPU %d (%s): %s -> %s W (%s; pods %s)", r.index, r.uuid, d.kind.value,
                      watts(d.requested_mw), d.reason, ", ".join(d.pods) or "-")
        elif d.kind is Kind.AGREE:
            log.warning("GPU %d (%s): %d pods share it and agree on %s W", r.index, r.uuid, len(d.pods),
                        watts(d.requested_mw))
        elif d.kind is Kind.HOLD:
            log.warning("GPU %d (%s): %s", r.index, r.uuid, d.reason)

    def processes_changed(self) -> bool:
        """True when a GPU's process list differs from what the last pass saw (cheap: reads only)."""
        if self._gpus is None or self.last_report is None or self.last_report.skipped:
            return False
        seen = {}
        try:
            count = self._gpus.device_count()
        except GpuError:
            return False  # the next pass reports it
        for i in range(count):
            try:
                r = self._gpus.read(i)
            except GpuError:
                continue  # a failing GPU is the pass's to report, never the poll's
            seen[r.uuid] = r.pids
        return seen != self._pids_seen
