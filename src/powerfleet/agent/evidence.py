"""Enforcement evidence for the fleet: one Redis hash per node, one JSON field per GPU UUID.

``powerfleet:enforcement:<node>`` is replaced atomically after every pass (MULTI: DEL,
HSET, EXPIRE) with a TTL of three reconcile intervals, so a reader sees one pass's view or
nothing, and a node whose agent stopped publishing drops out by itself. The field format is
in docs/agent.md ("Enforcement evidence"); ``enforcement_record`` builds it. A GPU whose write
or readback failed carries ``"enforced_w": null``: no enforced value without evidence.

Publishing runs on its own thread (latest report wins), so a Redis outage never slows a pass.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from powerfleet.agent.report import GpuOutcome, PassReport
from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")

EVIDENCE_PREFIX = "powerfleet:enforcement:"  # read by the budget ledger and the power guard
EVIDENCE_VERSION = 1


def evidence_key(node: str) -> str:
    return EVIDENCE_PREFIX + node


def enforcement_record(node: str, g: GpuOutcome, at: float, pods: dict[str, PodInfo]) -> dict[str, Any]:
    """One GPU's evidence, JSON-able; watts; None where not known."""
    return {
        "version": EVIDENCE_VERSION, "node": node, "uuid": g.uuid, "index": g.index,
        "pods": [{"uid": uid, "namespace": pods[uid].namespace if uid in pods else None,
                  "name": pods[uid].name if uid in pods else None} for uid in g.pods],
        "decision": g.decision, "requested_w": g.requested_w, "target_w": g.cap_w,
        "enforced_w": g.enforced_w if g.write != "failed" and g.readback in ("match", "skipped") else None,
        "current_w": g.current_w, "draw_w": g.draw_w, "min_w": g.min_w, "max_w": g.max_w,
        "write": g.write, "readback": g.readback, "revision": g.revision, "error": g.error_kind,
        "observed_at": at,
        # The readers' short forms (budget/evidence.py, power/telemetry.py): the one pod holding the
        # GPU ("" when none or several share it) and the time of the pass.
        "pod_uid": g.pods[0] if len(g.pods) == 1 else "", "at": at,
    }


class EvidencePublisher:
    def __init__(self, r: redis.Redis, node: str, ttl_s: int) -> None:
        self.r, self.node, self.ttl_s = r, node, int(ttl_s)
        self.published = 0

    def publish(self, report: PassReport, pods: dict[str, PodInfo]) -> None:
        """Replace the node's hash with this pass's evidence (one transaction)."""
        if report.dry_run or report.skipped:
            return  # a skipped pass has no fresh evidence: the hash expires if skips go on
        fields = {g.uuid: json.dumps(enforcement_record(self.node, g, report.at, pods), sort_keys=True)
                  for g in report.gpus if g.uuid}
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(evidence_key(self.node))
        if fields:
            pipe.hset(evidence_key(self.node), mapping=fields)
            pipe.expire(evidence_key(self.node), self.ttl_s)
        pipe.execute()
        self.published += 1


Sink = Callable[[PassReport, dict[str, PodInfo]], None]


class Handoff:
    """Hands finished passes to the sinks (Redis evidence, pod annotations) on its own thread:
    the latest report wins, so a slow or unreachable sink never slows a pass. A sink's failure
    is one warning per outage."""

    def __init__(self, node: str, sinks: list[Sink]) -> None:
        self.node, self.sinks = node, sinks
        self._cond = threading.Condition()
        self._pending: tuple[PassReport, dict[str, PodInfo]] | None = None
        self._stop = False
        self._failing: set[int] = set()
        self._thread = threading.Thread(target=self._run, name=f"agent-evidence-{node}", daemon=True)

    def offer(self, report: PassReport, pods: dict[str, PodInfo]) -> None:
        if report.dry_run or report.skipped:
            return
        with self._cond:
            self._pending = (report, pods)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                report, pods = self._pending  # type: ignore[misc]
                self._pending = None
            for i, sink in enumerate(self.sinks):
                try:
                    sink(report, pods)
                    if i in self._failing:
                        log.info("node %s: enforcement evidence published again", self.node)
                    self._failing.discard(i)
                except Exception as exc:  # Redis or API trouble: the next pass retries
                    if i not in self._failing:
                        log.warning("node %s: cannot publish enforcement evidence (%s); the next pass retries",
                                    self.node, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    self._failing.add(i)

    def start(self) -> "Handoff":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
