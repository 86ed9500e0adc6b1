"""GPUs that keep failing: reported, then left out of readiness, and retried every pass.

A GPU that refuses the set (``NOT_SUPPORTED``), is lost (``GPU_IS_LOST``), answers with
malformed values or trips a bug in the agent's own work on it fails the same way pass after
pass. After ``EXCLUDE_AFTER`` consecutive failing passes it is *excluded*: counted in
``powerfleet_agent_gpu_excluded``, named in the readiness detail, and no longer holding the
node NotReady (so a DaemonSet rollout goes on); the node's other GPUs stay enforced. Every
pass still tries it, and the first pass it works on clears it. One log line per GPU and kind
of failure, and one when it works again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from powerfleet.agent.metrics import AgentMetrics

log = logging.getLogger("powerfleet.agent")

EXCLUDE_AFTER = 3  # consecutive failing passes
EXCLUDABLE = frozenset({"not_supported", "gpu_lost", "malformed", "internal", "binding", "nvml"})


@dataclass
class _Failing:
    kind: str
    passes: int
    index: int


class FailingGpus:
    def __init__(self, node: str, metrics: AgentMetrics) -> None:
        self.node, self.metrics = node, metrics
        self._failing: dict[str, _Failing] = {}  # key (UUID, or "index N" when unreadable) -> state

    def failed(self, key: str, index: int, kind: str, message: str) -> bool:
        """Record one pass's failure of one GPU; True when the GPU is (now) excluded."""
        prev = self._failing.get(key)
        if prev is None or prev.kind != kind:
            log.error("node %s: GPU %d (%s): %s (kind %s; retried every pass%s)", self.node, index, key, message,
                      kind, f", left out of readiness after {EXCLUDE_AFTER} passes" if kind in EXCLUDABLE else "")
            prev = _Failing(kind, 0, index)
            self._failing[key] = prev
        prev.passes += 1
        prev.index = index
        excluded = kind in EXCLUDABLE and prev.passes >= EXCLUDE_AFTER
        if excluded:
            self.metrics.excluded.labels(str(index), key, self.node, kind).set(1)
        return excluded

    def worked(self, key: str) -> None:
        prev = self._failing.pop(key, None)
        if prev is None:
            return
        log.info("node %s: GPU %d (%s) works again after %d failing pass(es)", self.node, prev.index, key, prev.passes)
        try:
            self.metrics.excluded.remove(str(prev.index), key, self.node, prev.kind)
        except KeyError:
            pass

    def forget_others(self, seen: set[str]) -> None:
        """After a pass: entries of GPUs the pass did not meet at all (gone from the node)."""
        for key in [k for k in self._failing if k not in seen]:
            self.worked(key)
