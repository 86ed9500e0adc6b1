"""The demo's fleet as a scenario's events reach it (twin/demo/scenario_events.py ``FleetPort``).

Tasks go through the task API; a rack's new limit reaches the budget the way an operator's
config change does (the control worker restarted with the new ``budget.groups``); an agent
is killed with SIGKILL and started again with the same settings; Redis is flushed, or killed
(SIGKILL) and started again on its port.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerfleet.cli.demo_env import agent_env, config_env, planner_group_budgets


@dataclass
class DemoFleet:
    app: Any
    redis: Any
    launcher: Any
    twin: Any
    work: Path
    plan: Any = None  # the scenario (twin/demo/scenario_model.py)
    ports: dict[str, dict[str, str]] = field(default_factory=dict)
    killed: dict[str, int] = field(default_factory=dict)  # node -> the killed agent's exit status
    answering_before_kill: int = 0  # workers that answered a ping just before kill_broker

    def send(self, name: str, kwargs: dict[str, Any]) -> None:
        self.app.send_task(name, kwargs=kwargs)

    def has_task(self, name: str) -> bool:
        return name in self.app.tasks

    def _child(self, name: str) -> Any:
        return next((c for c in self.launcher.children if c.name == name), None)

    def set_limit(self, rack: str, watts: int) -> None:
        """Restart the control worker with every rack's planning budget from the twin's limits
        (the twin holds the new limit already: Twin.set_limit)."""
        groups = planner_group_budgets(self.twin)
        env = config_env({"budget.groups": "{" + ", ".join(self._group(g, w) for g, w in groups.items()) + "}"})
        self.launcher.env.update(env)
        os.environ.update(env)
        child = self._child("control")
        if child is not None:
            self.launcher.stop_child(child)
        self.launcher.spawn("control", "worker", "--queues", "control", "--name", "control@demo",
                            env=self.ports.get("control", {}))

    def _group(self, group: str, watts: int) -> str:
        racks = self.plan.topology.racks if self.plan is not None else {}
        ratio = float(racks[group].oversubscription) if group in racks else 1.0
        return f"{group}: {{limit_w: {watts}, oversubscription: {ratio}}}" if ratio > 1 else f"{group}: {watts}"

    def group_limit(self, rack: str) -> float | None:
        from powerfleet.budget.state import BudgetState

        history = BudgetState(self.redis).group_history()
        if not history:
            return None
        entry = history[-1]["groups"].get(rack) or {}
        return entry.get("limit_w")

    def planning_limit(self, rack: str) -> float | None:
        """What the control worker was given for the rack: its limit less the idle reserve."""
        return planner_group_budgets(self.twin).get(rack)

    def kill_agent(self, node: str) -> int:
        child = self._child(f"agent-{node}")
        if child is None:
            return self.killed.get(node, 0)
        self.launcher.children.remove(child)  # an event's doing, not a fleet process that stopped
        os.killpg(child.proc.pid, signal.SIGKILL)
        self.killed[node] = child.proc.wait()
        return self.killed[node]

    def restart_agent(self, node: str) -> None:
        if self._child(f"agent-{node}") is not None:
            return
        self.launcher.spawn(f"agent-{node}", "agent", "--node", node,
                            env={**agent_env(self.twin, node, self.work), **self.ports.get(f"agent-{node}", {})})

    def agent_answers(self, node: str) -> bool:
        try:
            return bool(self.app.control.ping(destination=[f"agent@{node}"], timeout=1.0))
        except Exception:  # noqa: BLE001 - not yet
            return False

    def flush_redis(self) -> None:
        self.redis.flushall()

    def _answering(self) -> int:
        try:
            return len(self.app.control.ping(timeout=1.0) or [])
        except Exception:  # noqa: BLE001 - the broker is down or the workers have not reconnected yet
            return 0

    def kill_broker(self) -> int:
        """SIGKILL the demo's private redis-server (its exit status); ``start_broker`` starts it again."""
        self.answering_before_kill = self._answering()
        return self.launcher.redis.kill()

    def start_broker(self) -> None:
        """The redis-server again on the same port, empty: the fleet's processes reconnect to it."""
        self.launcher.redis.start()

    def workers_answering(self) -> tuple[int, int]:
        """(workers answering a ping now, workers that answered before the broker was killed)."""
        return self._answering(), self.answering_before_kill
