"""One node's reconcile pass: a small program over injected ports.

Ports: the GPU backend (opened lazily, so a node whose NVML is not ready yet retries at the
next pass), a pod lister for this node, the proc root, the state store, the clock and the
metrics. ``NodeAgent`` holds what must survive between passes (the managed set) and is
not thread-safe: the runtime runs one pass at a time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from powerfleet.agent.apply import apply_limit, clamp
from powerfleet.agent.gpu import GpuBackend, GpuError, GpuReading, watts
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.podmap import annotations_by_uid, map_pids, pods_of
from powerfleet.agent.policy import Decision, Kind, decide
from powerfleet.agent.recovery import recover_orphans, restore_all
from powerfleet.agent.state import StateStore
from powerfleet.clock import Clock
from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")

PodLister = Callable[[], list[PodInfo]]


class GpuOutcome(BaseModel):
    """What a pass did (or, dry, would do) on one GPU. Watts; None where not applicable."""

    index: int
    uuid: str | None
    pods: list[str]
    decision: str | None  # None when the GPU could not be read
    requested_w: int | float | None
    cap_w: int | float | None  # after clamping; None when nothing is applied
    current_w: int | float | None
    draw_w: int | float | None = None
    action: str  # set | hold | none | error (dry run: would-set | hold | none)
    clamped: str | None = None  # min | max
    reason: str = ""
    error: str | None = None


class PassReport(BaseModel):
    node: str
    trigger: str
    dry_run: bool
    at: float
    duration_s: float
    skipped: str | None = None  # why the pass changed nothing, when it did not run
    gpus: list[GpuOutcome] = []
    managed: list[str] = []

    @property
    def good(self) -> bool:
        return self.skipped is None and not any(g.error for g in self.gpus)


class NodeAgent:
    def __init__(self, node: str, *, open_gpus: Callable[[], GpuBackend], list_pods: PodLister,
                 proc_root: str | os.PathLike[str], state: StateStore, clock: Clock, safe_default_watts: int,
                 metrics: AgentMetrics) -> None:
        self.node = node
        self._open_gpus = open_gpus
        self._gpus: GpuBackend | None = None
        self._list_pods = list_pods
        self.proc_root = Path(proc_root)
        self.state = state
        self.clock = clock
        self.safe_default_watts = safe_default_watts
        self.metrics = metrics
        loaded = state.load()
        self.managed: set[str] = set(loaded.uuids)
        # Inconclusive state: no orphan recovery, and the file is not rewritten before a good pass.
        self.state_conclusive = loaded.conclusive
        self._recovered = not loaded.conclusive
        self._unsaved = False
        self._last_kind: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.last_good_mono: float | None = None
        self._last_skip: str | None = None
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
        try:
            gpus = self.gpus()
            if not self._recovered and not dry_run:
                self._recover(gpus)
            count = gpus.device_count()
        except GpuError as exc:
            return self._skip(trigger, dry_run, f"GPU backend: {_one_line(exc)}")
        if count <= 0:
            return self._skip(trigger, dry_run, "no GPUs found")
        annotations = annotations_by_uid(pods)
        readings: list[GpuReading | GpuOutcome] = []
        for i in range(count):
            try:
                readings.append(gpus.read(i))
            except GpuError as exc:
                if not dry_run:
                    self.metrics.apply_failures.inc()
                readings.append(GpuOutcome(index=i, uuid=None, pods=[], decision=None, requested_w=None, cap_w=None,
                                           current_w=None, action="error", error=_one_line(exc)))
        all_pids = [p for r in readings if isinstance(r, GpuReading) for p in r.pids]
        pid_to_pod = map_pids(self.proc_root, all_pids)
        outcomes = []
        for r in readings:
            if isinstance(r, GpuOutcome):
                outcomes.append(r)
                continue
            decision = decide(pods_of(r.pids, pid_to_pod), annotations, busy=not r.idle,
                              safe_default_watts=self.safe_default_watts)
            outcomes.append(self._enforce(gpus, r, decision, dry_run))
        if self._last_skip is not None:
            log.info("node %s: passes run again (were skipped: %s)", self.node, self._last_skip)
            self._last_skip = None
        report = PassReport(node=self.node, trigger=trigger, dry_run=dry_run, at=self.clock.now(), duration_s=0.0,
                            gpus=outcomes)
        if not dry_run:
            self._persist(report.good)
        report.managed = sorted(self.managed)
        return report

    def _enforce(self, gpus: GpuBackend, r: GpuReading, d: Decision, dry_run: bool) -> GpuOutcome:
        out = GpuOutcome(index=r.index, uuid=r.uuid, pods=list(d.pods), decision=d.kind.value, requested_w=None,
                         cap_w=None, current_w=watts(r.current_mw), draw_w=watts(r.draw_mw), action="none",
                         reason=d.reason)
        if not dry_run:
            self._observe(r, d)
        if d.kind is Kind.IDLE:
            return out  # a worker that exits briefly may come back to the same GPU: keep the cap
        if d.kind is Kind.RELEASE:
            out.requested_w = watts(r.default_mw)
            if r.uuid not in self.managed:
                return out  # not ours: leave whatever limit it has
            target, direction = r.default_mw, None
        else:
            assert d.watts is not None
            out.requested_w = d.watts
            target, direction = clamp(d.watts * 1000, r)
        out.cap_w, out.clamped = watts(target), direction
        if dry_run:
            out.action = "hold" if r.current_mw == target else "would-set"
            return out
        if direction is not None:
            self.metrics.clamped.labels(direction=direction).inc()
        try:
            applied = apply_limit(gpus, r, target, d.kind.value)
        except GpuError as exc:
            self.metrics.apply_failures.inc()
            log.error("GPU %d (%s): %s", r.index, r.uuid, exc)
            out.action, out.error, out.cap_w = "error", _one_line(exc), None
            return out
        out.action = applied.action
        if d.kind is Kind.RELEASE:
            self.managed.discard(r.uuid)
            self._unsaved = True
        elif r.uuid not in self.managed:
            self.managed.add(r.uuid)  # only after the limit is known to hold
            self._unsaved = True
        self.metrics.applied_limit.labels(gpu=str(r.index)).set(applied.cap_mw / 1000)
        return out

    def _observe(self, r: GpuReading, d: Decision) -> None:
        """Metrics and logs for a decision; multi-pod and fallback decisions are logged when they change."""
        gpu = str(r.index)
        if d.kind in (Kind.IDLE, Kind.RELEASE):
            self.metrics.applied_limit.labels(gpu=gpu).set(r.current_mw / 1000)
        if r.draw_mw is not None:
            self.metrics.draw.labels(gpu=gpu).set(r.draw_mw / 1000)
        if d.kind in (Kind.AGREE, Kind.CONFLICT):
            self.metrics.multi_pod.labels(disposition=d.kind.value).inc()
        if d.uses_safe_default:
            self.metrics.safe_default.inc()
        key = (d.kind.value, d.pods)
        if self._last_kind.get(r.uuid) == key:
            return
        self._last_kind[r.uuid] = key
        if d.uses_safe_default:
            log.error("GPU %d (%s): %s -> safe default %d W (%s; pods %s)", r.index, r.uuid, d.kind.value,
                      self.safe_default_watts, d.reason, ", ".join(d.pods))
        elif d.kind is Kind.AGREE:
            log.warning("GPU %d (%s): %d pods share it and agree on %d W", r.index, r.uuid, len(d.pods), d.watts)

    # -- state --

    def _persist(self, good_pass: bool) -> None:
        if not self.state_conclusive:
            if not good_pass:
                return  # keep the unreadable file for a human until a pass has succeeded
            self.state_conclusive = True
            self._unsaved = True
        if not self._unsaved:
            return
        try:
            self.state.save(frozenset(self.managed))
            self._unsaved = False
        except OSError as exc:  # retried at the next pass; the in-memory set stays right
            log.warning("cannot write %s: %s (retrying at the next pass)", self.state.path, exc.strerror or exc)

    def _recover(self, gpus: GpuBackend) -> None:
        result = recover_orphans(gpus, frozenset(self.managed))
        self._recovered = True
        if result.managed != frozenset(self.managed):
            self.managed = set(result.managed)
            self._unsaved = True
            self._persist(good_pass=True)

    def start(self) -> None:
        """Startup: orphan recovery now if the GPUs can be opened, else at the first pass."""
        if self._recovered:
            return
        try:
            self._recover(self.gpus())
        except GpuError as exc:
            log.warning("node %s: GPUs not available at startup (%s); recovery waits for the first pass",
                        self.node, _one_line(exc))

    # -- shutdown --

    def shutdown(self) -> None:
        """Restore every managed GPU to its default, persist, then close the backend. Never raises."""
        try:
            if not self.managed:
                log.info("shutdown: no managed GPU; nothing to restore")
            elif self._gpus is None:
                self._gpus = self._try_open()
            if self.managed and self._gpus is not None:
                left = restore_all(self._gpus, frozenset(self.managed))
                if left != frozenset(self.managed):
                    self.managed = set(left)
                    self._unsaved = True
                    self._persist(good_pass=self.state_conclusive)
        except Exception:
            log.exception("shutdown: restoring defaults failed")
        finally:
            if self._gpus is not None:
                try:
                    self._gpus.close()  # after the restores, never before
                except Exception:
                    log.exception("shutdown: closing the GPU backend failed")
                self._gpus = None

    def close(self) -> None:
        """Close the backend without restoring anything (``agent once``: the caps stay)."""
        if self._gpus is not None:
            try:
                self._gpus.close()
            finally:
                self._gpus = None

    def _try_open(self) -> GpuBackend | None:
        try:
            return self.gpus()
        except Exception:
            log.exception("shutdown: cannot open the GPU backend; managed caps stay")
            return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
