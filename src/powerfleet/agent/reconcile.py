"""One node's reconcile pass: a small program over injected ports.

Ports: the GPU backend (opened lazily, so a node whose NVML is not ready yet retries at the
next pass), a pod lister for this node, the proc root, the state store, the clock, the
metrics, and ``may_actuate`` (None while this agent holds its node's lock and is not
drained, else the reason it may not touch a GPU). ``NodeAgent`` holds what must survive
between passes (the managed set, their owners, the targets it set) and is not thread-safe:
the runtime runs one pass at a time.

A pass reads every GPU, plans each GPU's decision, records the write-ahead intent for the
GPUs it is about to cap for the first time (one fsynced save), then sets and reads back, by
UUID. One GPU's failure, NVML's or the agent's own, stays that GPU's (agent/failing.py).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from powerfleet.agent.apply import ApplyFailed, apply_limit
from powerfleet.agent.attribution import attribute
from powerfleet.agent.catalog import card_range, safe_default_mw
from powerfleet.agent.failing import FailingGpus
from powerfleet.agent.gpu import GpuBackend, GpuError, GpuReading, watts
from powerfleet.agent.lifecycle import NodeLifecycle, one_line as _one_line
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.observe import PassObserver
from powerfleet.agent.ownership import allocated_pods, gone_uids, live_pods, owners_alive, owners_of
from powerfleet.agent.podmap import annotations_by_uid, map_pids
from powerfleet.agent.policy import Decision, Kind, decide
from powerfleet.agent.report import GpuOutcome, PassReport
from powerfleet.agent.state import Owner, StateStore
from powerfleet.agent.throttle import OverlayStore
from powerfleet.clock import Clock
from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")

PodLister = Callable[[], list[PodInfo]]

__all__ = ["GpuOutcome", "NodeAgent", "PassReport", "PodLister"]


@dataclass
class _Plan:
    r: GpuReading
    d: Decision
    min_mw: int
    max_mw: int
    owners: tuple[Owner, ...]

    @property
    def clamped_mw(self) -> int:
        """The requested cap clamped into the card's range (before any overlay)."""
        assert self.d.requested_mw is not None
        return min(max(self.d.requested_mw, self.min_mw), self.max_mw)


class NodeAgent(PassObserver, NodeLifecycle):
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
        # True while the node lock cannot be taken only because Redis is unreachable (the runtime's):
        # the pass then applies the caps the state owes and decides nothing new.
        self.owed_only: Callable[[], bool] = lambda: False
        self._allocations = allocations  # device ID -> [podresources.Allocation] (the kubelet's PodResources)
        self._allocation_problem: str | None = None
        self._refused_ids: set[str] = set()
        self.stopping = threading.Event()  # set by the runtime at shutdown: the pass stops before its next GPU
        self.metrics = metrics
        self.failing = FailingGpus(node, metrics)
        self._last_kind: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._noted: set[tuple[str, str]] = set()  # (uuid or index, kind): logged once
        self.last_good_mono: float | None = None
        self.last_report: PassReport | None = None
        self.last_pods: dict[str, PodInfo] = {}  # the pod view of the last pass, by UID (evidence)
        self._departed: dict[str, None] = {}  # UIDs seen leaving the view, oldest first (bounded)
        self._gone: set[str] = set()  # pod UIDs known gone at this pass (agent/attribution.py)
        self._pids_seen: dict[str, tuple[int, ...]] = {}  # uuid -> pids at the last pass (the process poll)
        self._last_skip: str | None = None
        self.blind: str | None = None
        self._load_state(state.load())

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
        # Pods first: without a complete list no cap may be computed (fail-safe: change nothing new).
        try:
            pods: list[PodInfo] | None = self._list_pods()
            why = ""
        except Exception as exc:
            if not dry_run:
                self.metrics.pod_list_failures.inc()
            pods, why = None, f"pod list failed: {_one_line(exc)}"
        refused = None if dry_run else self.may_actuate()
        if refused is not None and self.owed_only():
            return self._owed_pass(trigger, pods, "; ".join(w for w in (why, refused) if w))
        if pods is None:
            return self._skip(trigger, dry_run, why)
        if refused is not None:  # not the lock holder, or drained: never touch a GPU
            return self._skip(trigger, dry_run, refused)
        try:
            gpus = self.gpus()
            count = gpus.device_count()
        except GpuError as exc:
            return self._skip(trigger, dry_run, f"GPU backend: {_one_line(exc)}")
        if count <= 0:
            return self._skip(trigger, dry_run, "no GPUs found")
        readings: list[GpuReading | GpuOutcome] = [self._read(gpus, i, dry_run) for i in range(count)]
        ok = [r for r in readings if isinstance(r, GpuReading)]
        if not dry_run:
            self._adopt(ok, complete=len(ok) == count)  # a lost record rebuilt; absent GPUs dropped
        self._pids_seen = {r.uuid: r.pids for r in ok}
        blind = self._blind_spot([p for r in ok for p in r.pids])
        pid_to_pod = map_pids(self.proc_root, [p for r in ok for p in r.pids])
        live = {p.uid.lower(): p for p in live_pods(pods) if p.uid}
        annotations = annotations_by_uid(live.values())
        self._gone = gone_uids(pods, live, self.last_pods, self._departed)
        self.last_pods = live
        allocated = self._allocated_pods(live, ok, dry_run)
        outcomes: dict[int, GpuOutcome] = {o.index: o for o in readings if isinstance(o, GpuOutcome)}
        plans: list[_Plan] = []
        for r in ok:
            try:
                plans.append(self._plan(r, pid_to_pod, allocated.get(r.uuid, set()), annotations, live, dry_run))
            except Exception as exc:  # a bug in this GPU's work is this GPU's, never the pass's
                outcomes[r.index] = self._internal(r, exc, dry_run)
        changes = sum(p.d.kind not in (Kind.IDLE, Kind.HOLD) for p in plans)
        refused_intent = {} if dry_run else self._write_ahead([p for p in plans if self._caps(p)], changes=changes)
        for p in plans:
            if self.stopping.is_set() and not dry_run:
                outcomes[p.r.index] = GpuOutcome(index=p.r.index, uuid=p.r.uuid, pods=[], decision=None,
                                                 requested_w=None, cap_w=None, current_w=watts(p.r.current_mw),
                                                 action="none", reason="shutting down")
                continue
            try:
                outcomes[p.r.index] = self._enforce(gpus, p, live, dry_run, refused_intent.get(p.r.uuid))
            except Exception as exc:
                outcomes[p.r.index] = self._internal(p.r, exc, dry_run)
            if not dry_run:
                self._export(outcomes[p.r.index])
        if self._last_skip is not None:
            log.info("node %s: passes run again (were skipped: %s)", self.node, self._last_skip)
            self._last_skip = None
        report = PassReport(node=self.node, trigger=trigger, dry_run=dry_run, at=self.clock.now(), duration_s=0.0,
                            gpus=[outcomes[i] for i in sorted(outcomes)], blind=blind)
        if not dry_run:
            self.failing.forget_others({r.uuid for r in ok} | {g.uuid or f"index {g.index}" for g in report.gpus})
            self._settle(report, ok)
            if len(ok) == count:
                self.metrics.retire_gpus({r.uuid for r in ok})
            self._persist()
        report.managed = sorted(self.managed)
        return report

    def _plan(self, r: GpuReading, pid_to_pod: dict[int, str], owners: set[str], annotations: dict[str, str],
              live: dict[str, PodInfo], dry_run: bool) -> _Plan:
        rng = card_range(r.min_mw, r.max_mw, r.name)
        if rng.note:
            self._note(r.uuid, "range", logging.WARNING, f"GPU {r.index} ({r.uuid}): {rng.note}")
        safe = safe_default_mw(rng, fraction=self.safe_default_fraction, override_w=self.safe_default_watts)
        # Idle, MPS or graphics, or a MIG slice: capped from the allocations (the pods on one
        # parent's slices, or on a time-sliced GPU, share its cap like processes do).
        a = attribute(r, pid_to_pod, owners, annotations, self.proc_root, self._gone, blind=self.blind is not None)
        if owners and set(a.pods) - owners and not dry_run:  # a process of a pod the kubelet gave it not to
            self.metrics.podresources_mismatch.inc()
        d = decide(a.pods, annotations, busy=a.busy, safe_default_mw=safe, unmapped=a.unknown, listed=live,
                   complete=self.complete_view, current_mw=r.current_mw, blind=self.blind is not None)
        if d.unknown_owner and r.uuid not in self.managed and r.current_mw <= safe:  # safe already; not ours
            d = Decision(Kind.HOLD, d.pods, None, f"{d.reason}; at or below the safe default already",
                         unattributed=d.unattributed)
        if a.mps:
            d = replace(d, reason="; ".join(w for w in (d.reason, a.mps) if w))
        if d.kind is Kind.IDLE and r.uuid in self.managed and not owners_alive(self.owners.get(r.uuid, ()), live):
            # Nobody it was capped for is left (gone, or finished): the cap goes with its owners.
            d = Decision(Kind.RELEASE, d.pods, None, "idle, and the pods it was capped for are gone")
        return _Plan(r, d, rng.min_mw, rng.max_mw, owners_of(d.pods, annotations, live))

    @staticmethod
    def _caps(p: _Plan) -> bool:
        return p.d.kind not in (Kind.IDLE, Kind.HOLD, Kind.RELEASE)

    def _allocated_pods(self, live: dict[str, PodInfo], readings: list[GpuReading],
                        dry_run: bool) -> dict[str, set[str]]:
        """GPU UUID -> UIDs of the live pods the kubelet allocated it (or one of its MIG slices) to;
        {} without PodResources. A MIG UUID or an index counts for the GPU it names."""
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
        found = allocated_pods(got, live, readings)
        for why in found.refused:
            if not dry_run:
                self.metrics.podresources_refused.inc()
            if why not in self._refused_ids:
                self._refused_ids.add(why)
                log.error("node %s: kubelet allocation refused: %s", self.node, why)
        return found.by_gpu

    def _read(self, gpus: GpuBackend, i: int, dry_run: bool) -> GpuReading | GpuOutcome:
        try:
            return gpus.read(i)
        except Exception as exc:  # GpuError, or a bug: this GPU's alone
            err = exc if isinstance(exc, GpuError) else GpuError(f"GPU {i}: {_one_line(exc)}", kind="internal")
            out = GpuOutcome(index=i, uuid=err.uuid, pods=[], decision=None, requested_w=None, cap_w=None,
                             current_w=None, action="error", error=_one_line(err), error_kind=err.kind)
            if dry_run:
                return out
            self.metrics.gpu_errors.labels(kind=err.kind).inc()
            key = err.uuid or f"index {i}"
            if err.kind == "not_supported":
                out.action = "unsupported"  # reported, and left out of readiness: it cannot be capped
                dl = (str(i), err.uuid or "", self.node)
                self.metrics.unsupported.labels(*dl).set(1)
                if err.uuid:  # its series go with the GPU (retire_gpus)
                    self.metrics.gpu_labels(err.uuid, dl + ("", "", ""), dl)
                self._note(key, err.kind, logging.WARNING,
                           f"GPU {i} ({err.uuid or '?'}) has no power-limit support; it is left out of readiness")
            else:
                self.metrics.apply_failures.inc()
                out.excluded = self.failing.failed(key, i, err.kind, _one_line(err))
            return out

    def _internal(self, r: GpuReading, exc: Exception, dry_run: bool) -> GpuOutcome:
        if (r.uuid, "internal") not in self._noted:
            self._noted.add((r.uuid, "internal"))
            log.error("GPU %d (%s): the agent's work on it failed", r.index, r.uuid, exc_info=exc)
        out = GpuOutcome(index=r.index, uuid=r.uuid, pods=[], decision=None, requested_w=None, cap_w=None,
                         current_w=watts(r.current_mw), action="error", error=_one_line(exc), error_kind="internal")
        if not dry_run:
            self.metrics.gpu_errors.labels(kind="internal").inc()
            out.excluded = self.failing.failed(r.uuid, r.index, "internal", _one_line(exc))
        return out

    def _enforce(self, gpus: GpuBackend, p: _Plan, pods: dict[str, PodInfo], dry_run: bool,
                 intent_error: str | None) -> GpuOutcome:
        r, d, min_mw, max_mw = p.r, p.d, p.min_mw, p.max_mw
        out = GpuOutcome(index=r.index, uuid=r.uuid, pods=list(d.pods), decision=d.kind.value, requested_w=None,
                         cap_w=None, current_w=watts(r.current_mw), draw_w=watts(r.draw_mw), action="none",
                         reason=d.reason, min_w=watts(min_mw), max_w=watts(max_mw), unattributed=d.unattributed,
                         persistence=r.persistence)
        if not dry_run:
            self._observe(r, d, pods)
        if d.kind in (Kind.IDLE, Kind.HOLD):
            # idle: a worker may come back; hold: processes it cannot attribute keep the cap. What
            # is enforced was read from this GPU at the start of the pass.
            out.enforced_w = watts(r.enforced_mw if r.enforced_mw is not None else r.current_mw)
            if not dry_run:
                self.failing.worked(r.uuid)
            return out
        if d.kind is Kind.RELEASE:
            out.requested_w = watts(r.default_mw)
            if r.uuid not in self.managed:
                if not dry_run:
                    self.failing.worked(r.uuid)
                return out  # not ours: leave whatever limit it has
            target, direction = r.default_mw, None
        else:
            assert d.requested_mw is not None
            out.requested_w = watts(d.requested_mw)
            target = p.clamped_mw
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
        if intent_error is not None and r.current_mw != target:  # never a cap no record owns
            return self._failed(out, r, "state", f"the write-ahead record could not be saved ({intent_error}); "
                                "not capped", stage="write")
        last = self._targets.get(r.uuid)
        if last is not None and r.uuid in self.managed and r.current_mw != last[0]:
            self.metrics.readback_mismatch.inc()
            log.warning("GPU %d (%s): limit is %s W, not the %s W this agent set (external change?); re-applying",
                        r.index, r.uuid, watts(r.current_mw), watts(last[0]))
        try:
            applied = apply_limit(gpus, r, target, d.kind.value)
        except ApplyFailed as exc:
            self.metrics.apply_failures.inc()
            out = self._failed(out, r, exc.kind, _one_line(exc), stage=exc.stage)
            return out
        self.failing.worked(r.uuid)
        out.action = applied.action
        out.write = "ok" if applied.action == "set" else "skipped"
        out.readback = "match"
        if last is None or last[0] != target:
            last = (target, self._next_revision())
            self._targets[r.uuid] = last
            self._unsaved = True
        out.revision = last[1]
        out.enforced_w = self._enforced(gpus, r, target, applied.action == "set")
        if d.kind is Kind.RELEASE:
            self._release(r.uuid)
        else:
            if r.uuid not in self.managed:
                self.managed.add(r.uuid)  # only after the limit is known to hold
                self._unsaved = True
            if p.owners and self.owners.get(r.uuid) != p.owners:
                self.owners[r.uuid] = p.owners
                self._unsaved = True
        self.metrics.applied_limit.labels(gpu=str(r.index)).set(applied.cap_mw / 1000)
        return out

    def _failed(self, out: GpuOutcome, r: GpuReading, kind: str, error: str, *, stage: str) -> GpuOutcome:
        self.metrics.gpu_errors.labels(kind=kind).inc()
        out.action, out.error, out.error_kind, out.cap_w = "error", error, kind, None
        out.write, out.readback = ("failed", "skipped") if stage == "write" else ("ok", "failed")
        if kind == "mismatch":
            out.readback = "mismatch"
        out.excluded = self.failing.failed(r.uuid, r.index, kind, error)
        return out
