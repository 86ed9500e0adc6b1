"""The agent inside its worker process: one NodeAgent, passes that never overlap, and the
threads around it (pod watch, heartbeat, local timer, probe endpoint).

Three things ask for a pass:

* a tick (``agent.reconcile`` or ``agent.throttle`` task): runs its own pass, after waiting up
  to ``tick_wait_s`` for a running pass (or a process poll) to finish; past that wait (a pass
  stuck in a bounded call) it is *deferred*: the pass thread runs a tick pass as soon as the
  lock is free. A tick is never lost: a pass that started before it may have read the state
  (an overlay, a limit) the tick came to apply;
* the pod watch (an annotated pod added, changed, deleted, flipping Ready or starting a
  container): sets a flag the pass thread serves as soon as the lock is free, after a short
  debounce (``debounce_s``) so that a burst of events (a rollout's pods turning Ready together)
  makes one pass; a change that lands during a pass gets its own pass afterwards (coalesced,
  never lost);
* the local timer: when no tick has arrived for three intervals (beat or broker down), the
  pass thread runs a pass every interval until ticks come back;
* the process poll: every ``poll_s`` between passes the GPUs' process lists are read, and a
  change (a new workload's first process, an exit) gets a pass at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from powerfleet.agent.reconcile import NodeAgent, PassReport
from powerfleet.clock import Clock, SystemClock

log = logging.getLogger("powerfleet.agent")

STALE_INTERVALS = 3
# A pass in flight stops before its next GPU; the longest call it can be in is one bounded
# Kubernetes request (cluster.kube REQUEST_TIMEOUT_SECONDS, 25 s) or one NVML call.
STOP_WAIT_S = 30.0
# Watch events within this window of the first make one pass (a pod's Ready flip usually comes
# with its container statuses in one or two MODIFIED events).
WATCH_DEBOUNCE_S = 0.05
# How long a tick waits for a running pass before it defers its pass to the pass thread. A pass
# takes well under a second; the process poll holds the lock for one read of /proc and NVML.
TICK_WAIT_S = 10.0


class AgentRuntime:
    def __init__(self, agent: NodeAgent, *, interval_s: float, clock: Clock | None = None,
                 poll_s: float = 0.0, debounce_s: float = WATCH_DEBOUNCE_S, tick_wait_s: float = TICK_WAIT_S) -> None:
        self.agent = agent
        self.node = agent.node
        self.interval_s = interval_s
        self.poll_s = poll_s  # GPU process poll between passes (agent.process_poll_s); 0: off
        self.clock = clock or SystemClock()
        self.metrics = agent.metrics
        self._lock = threading.Lock()
        self.debounce_s = debounce_s
        self.tick_wait_s = tick_wait_s
        self._tick_owed = False  # a tick found the lock busy past tick_wait_s: the pass thread owes its pass
        self._kick = threading.Event()
        self._kick_reasons: list[str] = []  # what asked for the next watch pass
        self._reasons_mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"agent-passes-{self.node}", daemon=True)
        self._last_tick = self.clock.monotonic()
        self._on_timer = False
        self._stopped = False
        self.last_watch_reason = ""  # what the last watch pass was for (its log line)
        self.drained = False  # `agent drain`: defaults restored, no cap until the drain is undone
        self.lock: Any = None  # the node lock (lock.NodeLock) when the agent runs beside Redis
        self.local_lock: Any = None  # the node-local lock (lock.LocalLock), whatever the broker
        self.stoppers: list[Callable[[], None]] = []  # heartbeat, watcher, probe: stopped before the restore
        self.reporters: list[Callable[[PassReport, dict[str, Any]], None]] = []  # evidence publishers
        agent.may_actuate = self.actuation_refusal
        agent.owed_only = self.owed_only

    def serves(self, node: str) -> bool:
        return node == self.node

    def actuation_refusal(self) -> str | None:
        """None while this agent may set limits; else why not (drained, or not the lock holder)."""
        if self.lock is not None and not self.lock.held:
            return f"not the holder of the node lock ({self.lock.why})"
        if self.drained:
            return "drained: caps are at their defaults until the drain is undone"
        return None

    def owed_only(self) -> bool:
        """Fail-closed at boot: the node lock was not taken only because Redis is unreachable, and
        the node-local lock proves no other agent runs here: the caps the state owes are applied."""
        return (self.lock is not None and not self.lock.held and self.lock.unreachable
                and self.local_lock is not None and not self.drained)

    def drain(self) -> frozenset[str]:
        """Restore every managed GPU's default and stop capping (``powerfleet agent drain``).
        Returns the GPUs still managed (a restore that failed). Only the lock holder restores."""
        with self._lock:
            if self.lock is not None and not self.lock.held:
                log.error("node %s: drain requested but this agent does not hold the node lock; nothing restored",
                          self.node)
                return frozenset(self.agent.managed)
            self.drained = True
            return self.agent.restore("drain")

    def undrain(self) -> None:
        if self.drained:
            self.drained = False
            log.info("node %s: drain undone; caps are enforced again", self.node)
            self.request_pass("drain undone")

    # -- passes --

    def _run(self, trigger: str) -> PassReport:
        report = self.agent.run_pass(trigger)
        for hand_over in self.reporters:
            try:
                hand_over(report, self.agent.last_pods)
            except Exception:
                log.exception("node %s: handing the pass report over failed", self.node)
        return report

    def tick_pass(self) -> PassReport | None:
        """A pass for a tick; None when the lock stayed busy for ``tick_wait_s`` (the pass is then
        deferred to the pass thread, which runs it, trigger "tick", as soon as the lock is free)."""
        self._last_tick = self.clock.monotonic()
        if self._on_timer:
            self._on_timer = False
            log.info("node %s: ticks are back; local timer off", self.node)
        if not self._lock.acquire(timeout=self.tick_wait_s):
            self.metrics.passes.labels(trigger="tick", outcome="deferred").inc()
            with self._reasons_mutex:
                self._tick_owed = True
            self._kick.set()
            return None
        try:
            if self._stopped:
                return None  # shutting down: the defaults are (being) restored, no cap may follow
            return self._run("tick")
        finally:
            self._lock.release()

    def request_pass(self, reason: str) -> None:
        """Ask for a pass soon (from the watch); several requests before it runs make one pass."""
        with self._reasons_mutex:
            self._kick_reasons.append(reason)
        self._kick.set()

    def _take_reasons(self) -> tuple[str, bool]:
        """What asked for this pass, and whether a deferred tick is among them."""
        with self._reasons_mutex:
            reasons, self._kick_reasons = self._kick_reasons, []
            owed, self._tick_owed = self._tick_owed, False
        if not reasons:
            return ("a deferred tick" if owed else "a watch event"), owed
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        return ("a deferred tick and " if owed else "") + reasons[0] + more, owed

    def _loop(self) -> None:
        wait_s = min(self.poll_s or self.interval_s, self.interval_s)
        waited = 0.0  # real time slept since the last timer pass (the clock may be a test's)
        while not self._stop.is_set():
            kicked = self._kick.wait(timeout=wait_s)
            waited += 0.0 if kicked else wait_s
            if self._stop.is_set():
                return
            trigger = None
            if kicked:
                if self.debounce_s > 0 and self._stop.wait(self.debounce_s):
                    return
                self._kick.clear()
                reason, owed = self._take_reasons()
                self.last_watch_reason = reason
                log.info("node %s: pass for %s", self.node, reason)
                trigger = "tick" if owed else "watch"
            elif self.clock.monotonic() - self._last_tick >= STALE_INTERVALS * self.interval_s:
                if not self._on_timer:
                    log.warning("node %s: no tick for %d intervals; running passes on a local timer every %gs",
                                self.node, STALE_INTERVALS, self.interval_s)
                    self._on_timer = True
                if waited >= self.interval_s - 1e-9:
                    trigger, waited = "timer", 0.0
            if trigger is None and self.poll_s and self._processes_changed():
                trigger = "process"
            if trigger is None:
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._run(trigger)
                except Exception:
                    log.exception("node %s: %s pass failed", self.node, trigger)

    def _processes_changed(self) -> bool:
        """Between passes: did a process start or stop on a GPU since the last pass? A new
        workload's cap then follows within one poll (agent.process_poll_s), not one tick."""
        if not self._lock.acquire(blocking=False):
            return False  # a pass is running: it reads the processes itself
        try:
            return self.agent.processes_changed()
        except Exception:
            log.exception("node %s: polling the GPU processes failed", self.node)
            return False
        finally:
            self._lock.release()

    # -- readiness --

    def readiness(self) -> tuple[bool, str]:
        if self.agent.blind:  # at once, with the reason: a blind agent enforces nothing new
            return False, f"not-ready: {self.agent.blind}"
        last = self.agent.last_good_mono
        if last is None:
            self.metrics.last_good_pass_age.set(-1)
            return False, "not-ready: no good pass yet"
        age = self.clock.monotonic() - last
        self.metrics.last_good_pass_age.set(age)
        if age > STALE_INTERVALS * self.interval_s:
            return False, f"not-ready: last good pass {age:.1f}s ago (limit {STALE_INTERVALS * self.interval_s:g}s)"
        report = self.agent.last_report
        excluded = report.excluded if report is not None else []
        off = report.persistence_off if report is not None else []
        detail = f" excluded={','.join(excluded)}" if excluded else ""  # failing GPUs left out, retried
        detail += f" persistence_off={','.join(off)}" if off else ""
        return True, f"ok last_good_pass_age_s={age:.1f}{detail}"

    # -- lifecycle --

    def start(self) -> "AgentRuntime":
        self.agent.start()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """Stop the threads and a pass in flight (it stops before its next GPU), then close with
        the caps left in force for the next agent, under the pass lock. Never raises."""
        if self._stopped:
            return
        self._stopped = True
        self.agent.stopping.set()
        self._stop.set()
        self._kick.set()
        for stop in self.stoppers:
            try:
                stop()
            except Exception:
                log.exception("node %s: stopping a helper failed", self.node)
        got = self._lock.acquire(timeout=timeout_s)
        try:
            self.agent.shutdown(restore=False)
        finally:
            if got:
                self._lock.release()
                if self.lock is not None:
                    self.lock.release()  # after the last write: the next agent may take over
                if self.local_lock is not None:
                    self.local_lock.release()
            else:  # a pass is still inside a call (a hung NVML call?): it may yet write a limit
                log.error("node %s: a pass is still running after %gs; the node locks are kept until it returns or "
                          "the process exits", self.node, timeout_s)


# -- the one runtime of an agent worker process --

_current: AgentRuntime | None = None


def install(runtime: AgentRuntime | None) -> None:
    global _current
    _current = runtime


def current() -> AgentRuntime | None:
    return _current
