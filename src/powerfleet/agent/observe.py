"""What a pass reports about each GPU (metrics, logs) and the cheap process poll between passes.

A mixin of ``NodeAgent`` (agent/reconcile.py), which holds the attributes these methods use.
"""

from __future__ import annotations

import logging
from pathlib import Path
from powerfleet.agent.gpu import GpuBackend, GpuError, GpuReading, watts
from powerfleet.agent.metrics import AgentMetrics
from powerfleet.agent.podmap import proc_root_problem, visible
from powerfleet.agent.policy import Decision, Kind
from powerfleet.agent.report import GpuOutcome, PassReport
from powerfleet.clock import Clock
from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")


class PassObserver:
    node: str
    metrics: AgentMetrics
    clock: Clock
    proc_root: Path
    blind: str | None
    last_report: PassReport | None
    _gpus: GpuBackend | None
    _noted: set[tuple[str, str]]
    _last_kind: dict[str, tuple[str, tuple[str, ...]]]
    _pids_seen: dict[str, tuple[int, ...]]

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

    def _enforced(self, gpus: GpuBackend, r: GpuReading, target: int, written: bool) -> int | float | None:
        """The enforced limit after all limiters, read from the same GPU; counted when below the target."""
        try:
            mw = gpus.read_enforced(r.index, uuid=r.uuid) if written else r.enforced_mw
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
        self.metrics.supported(dl)
        if r.persistence is not None:
            self.metrics.persistence.labels(*dl).set(1 if r.persistence else 0)
            if not r.persistence:
                self._note(r.uuid, "persistence_off", logging.WARNING,
                           f"GPU {r.index} ({r.uuid}): persistence mode is off: its limit holds while this agent "
                           "keeps NVML open, and may be lost when the driver unloads after the agent exits")
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
