"""The demo's steps: how a scenario acts on the twin, and how it sees the fleet respond.

A step starts at its time and is then polled once a second until it holds (it took effect)
or the run ends: it acts the way a person would (edit a DGD, send a task through the task
API, PATCH a router by hand) and judges only by what the cluster, the GPUs and the routers
show afterwards. A step whose capability is not in this build (its task is not registered)
fails at once with that reason: it is never skipped silently or faked.

``StepRunner`` drives a list of ``Step``s (the scenario file's events, twin/demo/scenario_events.py;
the oversubscription scenario's own, twin/demo/oversubscribe.py); ``Probe`` reads what the steps
judge by: DGDs, pods, the budget's persisted status, retune's decision history.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerfleet.cluster.budget_store import status_object_name, stored_status
from powerfleet.cluster.dgd import DGD_API_VERSION, DGD_KIND, LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION
from powerfleet.twin.apiserver.errors import ApiError
from powerfleet.twin.runtime import Twin

RETUNE_STATE_SUFFIX = "-powerfleet-retune-state"
DECIDED = ("apply", "keep", "no-traffic", "advisory", "promoted")
WAIT = "wait"  # a step's start() asking to be tried again at the next tick


@dataclass
class Outcome:
    state: str = "pending"  # pending | running | ok | failed
    detail: str = ""
    started_at: float | None = None  # wall-clock time it started (acted)
    held_at: float | None = None  # wall-clock time it was seen to hold (took effect)

    def text(self) -> str:
        return self.state if self.state in ("pending", "running", "ok") else f"failed: {self.detail}"


@dataclass
class Step:
    name: str
    at: float  # fraction of the run
    start: Callable[[], str | None]  # returns a failure reason, or None when started
    poll: Callable[[], tuple[bool, str]]  # (holds, what was seen)
    outcome: Outcome = field(default_factory=Outcome)
    waiting: str = "waiting for a retune decision to be applied first"  # its detail while start() says WAIT


class StepRunner:
    """Runs ``steps``: each starts once the run's fraction reaches its ``at``, then is polled."""

    steps: list[Step]
    log: Callable[[str], None]

    def tick(self, fraction: float) -> None:
        for step in self.steps:
            o = step.outcome
            if o.state == "pending" and fraction >= step.at:
                try:
                    reason = step.start()
                except Exception as exc:  # noqa: BLE001 - a refused send is this step's failure, not the run's
                    reason = f"{type(exc).__name__}: {exc}"
                if reason == WAIT:
                    o.detail = step.waiting
                    continue
                if reason is not None:
                    o.state, o.detail = "failed", reason
                    self.log(f"scenario {step.name}: cannot run: {reason}")
                else:
                    o.state, o.started_at = "running", time.time()
            if o.state == "running":
                try:
                    holds, seen = step.poll()
                except Exception as exc:  # noqa: BLE001 - a probe error is "not yet", recorded
                    holds, seen = False, f"{type(exc).__name__}: {exc}"
                o.detail = seen
                if holds:
                    o.state, o.held_at = "ok", time.time()
                    self.log(f"scenario {step.name}: held ({seen})")

    def finish(self) -> None:
        for step in self.steps:
            o = step.outcome
            if o.state == "pending":
                o.state, o.detail = "failed", o.detail or "did not start before the end"
            elif o.state == "running":
                o.state, o.detail = "failed", f"not reached before the end; last seen: {o.detail}"

    def states(self) -> dict[str, str]:
        return {s.name: s.outcome.text() for s in self.steps}


class Probe:
    """What steps read from the twin's API server."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin

    def dgd(self, name: str) -> dict[str, Any]:
        return self.twin.api.get(DGD_API_VERSION, DGD_KIND, name, self.twin.spec.namespace)

    def budget_status(self, dgd: str) -> dict[str, Any]:
        """The budget's status for ``dgd`` as powerfleet persisted it: its ConfigMap
        ``<dgd>-powerfleet-budget`` (cluster/budget_store.py); empty before the first write."""
        try:
            cm = self.twin.api.get("v1", "ConfigMap", status_object_name(dgd), self.twin.spec.namespace)
        except ApiError as exc:
            if exc.code == 404:
                return {}
            raise
        return stored_status(cm).status

    def pods(self, dgd: str, component: str) -> list[dict[str, Any]]:
        return [p for p in self.twin.api.list("v1", "Pod", self.twin.spec.namespace)
                if (p["metadata"].get("labels") or {}).get(LABEL_DGD_NAME) == dgd
                and p["metadata"]["labels"].get(LABEL_COMPONENT) == component]

    def retune_history(self) -> dict[str, list[dict[str, Any]]]:
        """Each deployment's saved decision history (from the retune state Lease), if any."""
        out: dict[str, list[dict[str, Any]]] = {}
        try:
            from powerfleet.retune.leadership import STATE_ANNOTATION
        except ImportError:
            return out
        for lease in self.twin.api.list("coordination.k8s.io/v1", "Lease", self.twin.spec.namespace):
            name = lease["metadata"]["name"]
            if not name.endswith(RETUNE_STATE_SUFFIX):
                continue
            raw = (lease["metadata"].get("annotations") or {}).get(STATE_ANNOTATION)
            try:
                state = json.loads(raw) if raw else {}
            except ValueError:
                continue
            out[name[: -len(RETUNE_STATE_SUFFIX)]] = [h for h in state.get("history", []) if isinstance(h, dict)]
        return out
