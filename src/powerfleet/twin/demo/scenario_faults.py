"""A scenario's failures of the fleet's own processes (docs/twin.md "Events"): an agent killed and
started again, Redis flushed, the broker killed and started again on its port, a node's power
telemetry lost, a demand surge. A mixin of ``ScenarioRun`` (twin/demo/scenario_events.py): each
``_<kind>(event)`` gives the step's ``start`` and ``poll``; the processes are reached through the
run's ``FleetPort``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from powerfleet.twin.demo import scenario_model as M


class FaultEvents:
    """Needs ``self.fleet`` (a FleetPort), ``self.twin``, ``self.scenario`` and ``self.log``."""

    fleet: Any
    twin: Any
    scenario: M.Scenario
    log: Callable[[str], None]

    def _kill_agent(self, e: M.NodeEvent) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        if e.kind == "restart_agent":
            def start() -> str | None:
                self.fleet.restart_agent(e.node)
                self.log(f"scenario: the agent of {e.node} starts again")
                return None
            return start, lambda: (self.fleet.agent_answers(e.node), f"agent of {e.node} answers a ping: "
                                                                      f"{self.fleet.agent_answers(e.node)}")
        code: list[int] = []

        def kill() -> str | None:
            code.append(self.fleet.kill_agent(e.node))
            self.log(f"scenario: the agent of {e.node} is killed (SIGKILL)")
            return None
        return kill, lambda: (True, f"agent of {e.node} exited {code[0] if code else '?'}")

    _restart_agent = _kill_agent

    def _flush_redis(self, e: M.FlushRedis) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        def start() -> str | None:
            self.fleet.flush_redis()
            self.log("scenario: Redis flushed (every queue, result, lock and record lost)")
            return None
        return start, lambda: (True, "flushed")

    def _kill_broker(self, e: M.KillBroker) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        seen: dict[str, Any] = {}

        def start() -> str | None:
            seen["code"], seen["at"] = self.fleet.kill_broker(), time.time()
            self.log(f"scenario: the broker (redis-server) is killed (SIGKILL); it starts again on its port in "
                     f"{e.down_s:g} s, empty: every queue, result, lock and record lost")
            return None

        def poll() -> tuple[bool, str]:
            if "back" not in seen:
                if time.time() - seen["at"] < float(e.down_s):
                    return False, f"redis-server exited {seen['code']}; down"
                self.fleet.start_broker()
                seen["back"] = time.time()
                self.log("scenario: the broker is back on its port (empty); the fleet reconnects")
            answering, before = self.fleet.workers_answering()
            return answering >= before, (f"redis-server exited {seen['code']}, back on its port after "
                                         f"{seen['back'] - seen['at']:.1f} s; {answering} of the {before} workers "
                                         "that answered before answer a ping")
        return start, poll

    def _telemetry_fault(self, e: M.TelemetryFault) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        began: list[float] = []

        def start() -> str | None:
            self.twin.nodes[e.node].telemetry_lost = True
            began.append(time.time())
            self.log(f"scenario: {e.node}'s power telemetry is lost for {self._span(e):g} s (NVML's power reading "
                     "fails)")
            return None

        def poll() -> tuple[bool, str]:
            if time.time() - began[0] < self._span(e):
                return False, "telemetry lost"
            self.twin.nodes[e.node].telemetry_lost = False
            self.log(f"scenario: {e.node}'s power telemetry is back")
            return True, f"lost for {self._span(e):g} s, back"
        return start, poll

    def _set_load(self, e: M.SetLoad) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        began: list[float] = []
        targets = [e.deployment] if e.deployment else list(self.scenario.deployments)

        def start() -> str | None:
            self.twin.load_scale.update({d: float(e.x) for d in targets})
            began.append(time.time())
            self.log(f"scenario: demand surge: the workers' load of {', '.join(targets)} x{e.x:g} for "
                     f"{self._span(e):g} s")
            return None

        def poll() -> tuple[bool, str]:
            if time.time() - began[0] < self._span(e):
                return False, f"load x{e.x:g}"
            for d in targets:
                self.twin.load_scale.pop(d, None)
            self.log("scenario: the surge ends")
            return True, f"load x{e.x:g} for {self._span(e):g} s, then back"
        return start, poll

    def _span(self, e: M.TelemetryFault | M.SetLoad) -> float:
        return M.at_s(e.duration_s, self.scenario.duration_s)
