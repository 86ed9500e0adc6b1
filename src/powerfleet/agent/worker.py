"""The agent as a Celery worker: solo pool, its own queue only, the runtime around it.

Why the solo pool: the NVML handle, the managed set, the pod watch, the node lock and the
shutdown must live in the one process that receives SIGTERM. With prefork the pass would run
in a child that the pool kills mid-write. A pass is milliseconds of work, so a
single process loses nothing; Celery's time limits are not enforced by the solo pool, and
the calls that can hang carry their own timeouts (pod LIST 20 s server / 25 s client).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import bootsteps, signals

from powerfleet.agent import runtime as agent_runtime
from powerfleet.agent.build import build_runtime
from powerfleet.config import FleetConfig
from powerfleet.queues import agent_worker, node_queue

log = logging.getLogger("powerfleet.agent")

BINDING_CHECK_S = 2.0
FORCED_EXIT_AFTER_S = 15.0  # after the stop (at most STOP_WAIT_S), inside the chart's grace period


def check_binding(consumer: Any, node: str) -> bool:
    """Make the worker consume ``node.<node>`` and nothing else; True (and one warning) if it had to.

    Flower (or ``celery control``) can cancel a worker's consumer or add others; an agent that
    consumed another node's queue would run that node's passes (refused, but never served)
    and one not consuming its own would never get a tick.
    """
    own = node_queue(node)
    tc = consumer.task_consumer
    if tc is None:
        return False
    names = sorted({q.name for q in tc.queues})
    extra = [q for q in names if q != own]
    missing = own not in names or not tc.consuming_from(own)
    if not extra and not missing:
        return False
    log.warning("agent %s: consuming %s instead of %s only; restoring the binding", node,
                ", ".join(names) or "nothing", own)
    for q in extra:
        consumer.cancel_task_queue(q)
    if missing:
        consumer.add_task_queue(own)
    rt = agent_runtime.current()
    if rt is not None:
        rt.metrics.binding_restores.inc()
    return True


def binding_guard_step(node: str, interval_s: float) -> type[bootsteps.StartStopStep]:
    """A consumer bootstep that checks the binding every interval, on the worker's own event loop."""

    class BindingGuard(bootsteps.StartStopStep):
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.tref: Any = None

        def start(self, c: Any) -> None:
            self.tref = c.timer.call_repeatedly(interval_s, self._check, (c,), priority=10)

        def _check(self, c: Any) -> None:
            try:
                check_binding(c, node)
            except Exception:  # a broker hiccup here must not stop the consumer
                log.exception("agent %s: binding check failed", node)

        def stop(self, c: Any) -> None:
            if self.tref is not None:
                self.tref.cancel()
                self.tref = None

    return BindingGuard


def _stop_then_exit(rt: agent_runtime.AgentRuntime, grace_s: float) -> None:
    rt.stop()  # stops a pass in flight, persists, closes NVML with the caps in force; never raises
    if threading.Event().wait(grace_s):
        return  # never set: this is a bounded wait for Celery's own shutdown
    log.warning("agent %s: the worker did not finish its shutdown within %gs of the agent's stop (broker "
                "unreachable?); exiting now", rt.node, grace_s)
    logging.shutdown()
    os._exit(0)


def run_agent_worker(app: Any, config: FleetConfig, node: str, loglevel: str,
                     probe: tuple[str, int] | None = None) -> None:
    """Build and start the runtime, run the worker until shutdown, then stop the agent (caps stay)."""
    rt = build_runtime(config, node, broker_url=app.broker_url_resolved, probe=probe)
    agent_runtime.install(rt)
    # The check is a local look at the consumer (no I/O unless it must repair), so it runs more
    # often than passes: a binding changed from Flower is back within a few seconds.
    app.steps["consumer"].add(binding_guard_step(node, min(config.beat.reconcile_interval_s, BINDING_CHECK_S)))

    def on_shutdown(**_: Any) -> None:
        rt.stop()

    def on_shutting_down(**_: Any) -> None:
        # Celery's SIGTERM/SIGINT handler only sets a flag that its loop checks; while the broker
        # is unreachable the loop sits in its reconnect retries and never gets there. So the
        # agent's stop starts now, on its own thread, and the process exits if Celery cannot.
        threading.Thread(target=_stop_then_exit, args=(rt, FORCED_EXIT_AFTER_S), name="agent-shutdown",
                         daemon=True).start()

    def on_setup(**_: Any) -> None:
        rt.start()  # after Celery set up logging, before it connects: passes never wait for the broker

    signals.celeryd_after_setup.connect(on_setup, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
    signals.worker_shutting_down.connect(on_shutting_down, weak=False)
    try:
        app.worker_main(["worker", "-Q", node_queue(node), "-n", agent_worker(node), "-P", "solo", "-c", "1",
                         "--prefetch-multiplier", "1", "--loglevel", loglevel, "--without-mingle",
                         "--without-gossip"])
    finally:
        rt.stop()  # idempotent: also when the worker never got to its shutdown signal
