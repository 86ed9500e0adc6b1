"""A scenario file's events, run against the twin and the fleet (docs/twin.md "Events").

Each event is a ``Step``: it acts at its time (what an operator, a tenant or a failure would do)
and then holds once the twin or the fleet shows it took effect; ``Outcome.started_at`` and
``held_at`` are when it acted and when it was seen to take effect. A task this build lacks, a
refused send or a probe that never holds is that event's failed check, with the reason.

The fleet's processes are reached through a ``FleetPort`` (cli/demo_run.py): tasks through the
task API, and the processes themselves (the control worker restarted with a rack's new limit;
the failures of twin/demo/scenario_faults.py: an agent killed and started again, Redis flushed,
the broker killed and started again).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from powerfleet.cluster.dgd import DGD_API_VERSION, DGD_KIND, POWER_ANNOTATION
from powerfleet.twin.demo import scenario_model as M
from powerfleet.twin.apiserver.errors import ApiError
from powerfleet.twin.cluster.kubelet import terminating
from powerfleet.twin.runtime import Twin
from powerfleet.twin.demo.scenario import WAIT, Probe, Step, StepRunner
from powerfleet.twin.demo.scenario_faults import FaultEvents
from powerfleet.twin.demo.scenario_tenants import tenant_pod
from powerfleet.twin.demo.scenario_twin import multiplier_at

CLAMPS = ("gpu_capacity",)
LOAD_WINDOW_TICKS = 600  # the served token rates kept per deployment (one a tick)


class FleetPort(Protocol):
    def send(self, name: str, kwargs: dict[str, Any]) -> None: ...
    def has_task(self, name: str) -> bool: ...
    def set_limit(self, rack: str, watts: int) -> None: ...
    def group_limit(self, rack: str) -> float | None: ...
    def planning_limit(self, rack: str) -> float | None: ...
    def kill_agent(self, node: str) -> int: ...
    def restart_agent(self, node: str) -> None: ...
    def agent_answers(self, node: str) -> bool: ...
    def flush_redis(self) -> None: ...
    def kill_broker(self) -> int: ...
    def start_broker(self) -> None: ...
    def workers_answering(self) -> tuple[int, int]: ...


def retune_applied_at(probe: Probe) -> bool:
    return any(h.get("outcome") == "apply" for hs in probe.retune_history().values() for h in hs)


class ScenarioRun(StepRunner, Probe, FaultEvents):
    """The events of ``scenario`` as steps, plus its traffic multipliers, applied each tick."""

    def __init__(self, scenario: M.Scenario, twin: Twin, fleet: FleetPort, log: Callable[[str], None]) -> None:
        Probe.__init__(self, twin)
        self.scenario, self.fleet, self.log = scenario, fleet, log
        self._last_load: dict[str, tuple[float, dict[str, int]]] = {}  # dgd -> (sent at, replicas) of propose_load
        self.roles = {n: d.roles(n) for n, d in scenario.deployments.items()}  # dgd -> role -> component
        self.steps = [self._step(i, e) for i, e in enumerate(scenario.events)]
        self.at_s = {s.name: M.at_s(e.at, scenario.duration_s) for s, e in zip(self.steps, scenario.events)}
        self._rates: dict[str, float] = {}
        self._served: dict[str, list[tuple[float, float, float]]] = {}  # dgd -> (t, input tok/s, output tok/s)

    def tick(self, fraction: float) -> None:
        t_s = fraction * self.scenario.duration_s
        for dgd, source in self.twin.sources.items():
            x = multiplier_at(self.scenario, dgd, t_s)
            if self._rates.get(dgd, 1.0) != x:
                self.log(f"scenario: {dgd} traffic x{x:g}")
            self._rates[dgd], source.rate = x, x
            seen = self._served.setdefault(dgd, [])
            seen.append((time.time(), *self.twin.token_rates(dgd)))
            del seen[:-LOAD_WINDOW_TICKS]
        super().tick(fraction)
        for step in self.steps:  # a planner following the load proposes again every every_s
            again = getattr(step, "again", None)
            if again is not None and step.outcome.state in ("running", "ok"):
                again()

    def _step(self, i: int, e: Any) -> Step:
        name = e.name or f"{e.kind}-{i}"
        at = M.at_s(e.at, self.scenario.duration_s) / self.scenario.duration_s
        start, poll = getattr(self, f"_{e.kind}")(e)
        step = Step(name, at, start, poll)
        if isinstance(e, M.ProposeLoad) and e.every_s:
            step.again = self._repeat(e, step)  # type: ignore[attr-defined]
        if isinstance(e, M.PatchRouter) and e.after_retune_applied:
            step.waiting = "waiting for retune to apply a decision first"
        return step

    def _task(self, name: str) -> str | None:
        return None if self.fleet.has_task(name) else f"{name} is not a task in this build"

    def _deployment(self, name: str) -> str:
        return f"{self.twin.spec.namespace}/{name}"

    def _replicas(self, dgd: str) -> dict[str, int]:
        """Replicas by component name and by role (a manifest's components have names of their own)."""
        by_comp = {c: int(s.get("replicas", 1)) for c, s in self.dgd(dgd)["spec"]["services"].items()}
        return {**by_comp, **{r: by_comp[c] for r, c in self.roles.get(dgd, {}).items() if c in by_comp}}

    # -- set_limit: the rack's limit changes; the control worker restarts with it --

    def _set_limit(self, e: M.SetLimit) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        def start() -> str | None:
            self.twin.set_limit(e.rack, e.limit_w)
            self.fleet.set_limit(e.rack, e.limit_w)
            self.log(f"scenario: {e.rack} limit -> {e.limit_w} W (the control worker restarts with it)")
            return None

        def poll() -> tuple[bool, str]:
            seen = self.fleet.group_limit(e.rack)
            want = self.fleet.planning_limit(e.rack)
            return seen == want, f"budget tick's {e.rack} planning limit {seen} W (want {want} W)"
        return start, poll

    # -- propose / propose_load: the planner's proposal, through the budget --

    def _propose(self, e: M.Propose) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        before: dict[str, int] = {}
        steps: list[tuple[int, ...]] = []
        reasons: set[str] = set()

        def start() -> str | None:
            if (missing := self._task("powerfleet.budget.propose")):
                return missing
            before.update(self._replicas(e.deployment))
            self._readmit(e.readmit, e.deployment)
            self.fleet.send("powerfleet.budget.propose", {"deployment": self._deployment(e.deployment),
                                                          "replicas": dict(e.replicas)})
            self.log(f"scenario: budget.propose {e.deployment} " + ", ".join(
                f"{r} {before.get(r, 0)} -> {n}" for r, n in e.replicas.items()))
            return None

        def poll() -> tuple[bool, str]:
            now = self._replicas(e.deployment)
            row = tuple(now.get(r, 0) for r in e.replicas)
            if not steps or steps[-1] != row:
                steps.append(row)
            reasons.update(r for r in self.budget_status(e.deployment).get("reasons", []) if isinstance(r, str))
            path = " -> ".join(str(s) for s in steps)
            seen = f"({', '.join(e.replicas)}) replicas {path}; proposed {tuple(e.replicas.values())}; " \
                   f"planner reasons seen {sorted(reasons)}"
            if e.expect == "applied":
                return all(now.get(r) == n for r, n in e.replicas.items()), seen
            clamped = any(r.startswith("power_") or r in CLAMPS for r in reasons)
            grew = [r for r, n in e.replicas.items() if n > before.get(r, 0)]
            shrank = [r for r, n in e.replicas.items() if n < before.get(r, 0) and before.get(r, 0) > 1]
            staged = bool({"power_rebalance_staged", "gpu_rebalance_staged"} & reasons)
            ok = bool(grew) and all(before.get(r, 0) < now.get(r, 0) < e.replicas[r] for r in grew) and clamped \
                and (staged or not shrank)
            return ok, seen + f"; {'staged' if staged else 'not staged'}"
        return start, poll

    def _readmit(self, readmit: bool, dgd: str) -> None:
        if readmit and self.fleet.has_task("powerfleet.budget.readmit"):
            # A cap change is drift against what the planner admitted: it failed the deployment
            # closed. An operator re-admits it once the new caps are rolled out (docs/budget.md).
            self.fleet.send("powerfleet.budget.readmit", {"deployment": self._deployment(dgd)})
            self.log(f"scenario: budget.readmit {dgd}")

    def load_proposal(self, e: M.ProposeLoad) -> tuple[dict[str, float], dict[str, int]]:
        """(load per role, replicas) from the deployment's served token rates: prefill by input
        tokens/s, decode by output tokens/s, an aggregated worker by both."""
        # The mean over the last every_s seconds (20 s at most once): the trace is bursty, and a
        # planner that followed each second's rate would roll the deployment back and forth.
        span = float(e.every_s or 20.0)
        seen = [r for r in self._served.get(e.deployment, []) if r[0] >= time.time() - span]
        isl, osl = ((sum(r[1] for r in seen) / len(seen), sum(r[2] for r in seen) / len(seen)) if seen
                    else self.twin.token_rates(e.deployment))
        load = {"prefill": isl, "decode": osl, "worker": isl + osl}
        used = {r: round(load[r], 1) for r in e.target_per_replica}
        return used, {r: max(1, math.ceil(used[r] / float(t))) for r, t in e.target_per_replica.items()}

    def _send_load(self, e: M.ProposeLoad) -> dict[str, int]:
        load, replicas = self.load_proposal(e)
        self.fleet.send("powerfleet.budget.propose_load", {
            "deployment": self._deployment(e.deployment), "load": load,
            "target_per_replica": {r: float(t) for r, t in e.target_per_replica.items()}})
        self.log(f"scenario: budget.propose_load {e.deployment}: load " + ", ".join(
            f"{r} {w:.0f} tok/s" for r, w in load.items()) + " -> " + ", ".join(f"{r} {n}" for r, n in replicas.items()))
        return replicas

    def _propose_load(self, e: M.ProposeLoad) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        def start() -> str | None:
            if (missing := self._task("powerfleet.budget.propose_load")):
                return missing
            self._readmit(e.readmit, e.deployment)
            self._last_load[e.deployment] = (time.time(), self._send_load(e))
            return None

        def poll() -> tuple[bool, str]:
            want = self._last_load[e.deployment][1]
            now = self._replicas(e.deployment)
            reasons = [r for r in self.budget_status(e.deployment).get("reasons", []) if isinstance(r, str)]
            clamp = [r for r in reasons if r.startswith("power_") or r in CLAMPS]
            at = all(now.get(r) == n for r, n in want.items())
            seen = f"replicas {now} for proposal {want}" + (f"; the budget binds: {', '.join(clamp)}" if clamp else "")
            return at or bool(clamp), seen
        return start, poll

    def _repeat(self, e: M.ProposeLoad, step: Step) -> Callable[[], None]:
        def again() -> None:
            sent_at = self._last_load.get(e.deployment, (0.0, {}))[0]
            if e.every_s and time.time() - sent_at >= e.every_s:
                self._last_load[e.deployment] = (time.time(), self._send_load(e))
        return again

    # -- set_annotation: a component's power annotation (the operator rolls its pods) --

    def _set_annotation(self, e: M.SetAnnotation) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        component = self.roles[e.deployment][e.component]

        def start() -> str | None:
            self.twin.set_component_cap(e.deployment, component, e.watts)
            self.log(f"scenario: {e.deployment}/{component} power annotation -> {e.watts} W (the operator rolls "
                     "its pods)")
            return None

        def poll() -> tuple[bool, str]:
            pods = [p for p in self.pods(e.deployment, component) if not terminating(p)]
            names = {p["metadata"]["name"] for p in pods}
            annotated = all((p["metadata"].get("annotations") or {}).get(POWER_ANNOTATION) == str(e.watts)
                            for p in pods)
            samples = self.twin.snapshot_samples()
            caps = sorted({g.cap_w for g in samples[-1].gpus if g.pod in names}) if samples else []
            ok = bool(pods) and annotated and caps == [float(e.watts)]
            return ok, f"{len(pods)} {e.component} pods, annotated {annotated}, caps on their GPUs {caps}"
        return start, poll

    # -- tenants and pods --

    def _add_tenant(self, e: M.AddTenant) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        t = e.tenant

        def start() -> str | None:
            from powerfleet.twin.demo.scenario_tenants import free_gpus

            node = t.node or (self.twin.spec.racks[t.rack][0] if t.rack else None)
            pods = self.twin.api.list("v1", "Pod", self.twin.spec.namespace)
            taken = {n: set(range(self.twin.spec.gpus_of(n))) - f for n, f in free_gpus(self.twin.spec, pods).items()}
            self.twin.tenant_load[t.name] = float(t.load)
            self.twin.api.apply(tenant_pod(self.twin.spec, t.name, t.gpus, t.power_w, node=node, taken=taken,
                                           grace_s=t.grace_s, tolerations=[x.as_k8s() for x in t.tolerations]))
            self.log(f"scenario: tenant {t.name} arrives ({t.gpus} GPUs" + (f", {t.power_w} W" if t.power_w else "")
                     + (f", on {node})" if node else ", unbound: the scheduler places it)"))
            return None

        def poll() -> tuple[bool, str]:
            pod = self.twin.api.get("v1", "Pod", t.name, self.twin.spec.namespace)
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if node and phase == "Running":
                return True, f"scheduled on {node}"
            reason = next((c.get("reason") for c in (pod.get("status") or {}).get("conditions", [])
                           if c.get("type") == "PodScheduled"), None)
            return False, f"{phase} ({reason or 'not scheduled'})"
        return start, poll

    def _delete_pod(self, e: M.DeletePod) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        def start() -> str | None:
            from kubernetes import client, config

            api = config.new_client_from_config(str(self.twin.kubeconfig))
            try:
                client.CoreV1Api(api).delete_namespaced_pod(e.pod, self.twin.spec.namespace)
            except client.ApiException as exc:
                return f"DELETE pod {e.pod}: HTTP {exc.status} {exc.reason}"
            finally:
                api.close()
            self.log(f"scenario: pod {e.pod} deleted")
            return None

        def poll() -> tuple[bool, str]:
            try:
                pod = self.twin.api.get("v1", "Pod", e.pod, self.twin.spec.namespace)
            except ApiError as exc:
                if exc.code == 404:
                    return True, "gone"
                raise
            return False, "terminating" if terminating(pod) else "still there"
        return start, poll

    def _recreate_dgd(self, e: M.RecreateDgd) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        saved: dict[str, Any] = {}

        def start() -> str | None:
            obj = self.dgd(e.deployment)
            saved.update({"apiVersion": obj["apiVersion"], "kind": obj["kind"], "spec": obj["spec"],
                          "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "labels")
                                       if k in obj["metadata"]}})
            self.twin.api.delete(DGD_API_VERSION, DGD_KIND, e.deployment, self.twin.spec.namespace)
            self.log(f"scenario: DGD {e.deployment} deleted (its pods are garbage-collected); created again once "
                     "they are gone")
            return None

        def poll() -> tuple[bool, str]:
            try:
                obj = self.dgd(e.deployment)
            except ApiError as exc:
                if exc.code != 404:
                    raise
                left = [p for p in self.twin.api.list("v1", "Pod", self.twin.spec.namespace)
                        if (p["metadata"].get("labels") or {}).get("nvidia.com/dynamo-graph-deployment-name")
                        == e.deployment]
                if not left:
                    self.twin.api.apply(saved)
                    return False, "its pods are gone; created again"
                return False, f"deleted; {len(left)} of its pods still there"
            state = (obj.get("status") or {}).get("state")
            return state == "successful", f"created again; state {state}"
        return start, poll

    # -- patch_router: a router changed by hand --

    def _patch_router(self, e: M.PatchRouter) -> tuple[Callable[[], str | None], Callable[[], tuple[bool, str]]]:
        target: list[Any] = []

        def start() -> str | None:
            if e.expect == "reverted" and (missing := self._task("powerfleet.retune.apply")):
                return missing
            if e.after_retune_applied and not retune_applied_at(self):
                return WAIT  # retune restores the settings it decided; until one was applied there are none
            fes = [f for f in self.twin.frontends.values() if f.dgd == e.deployment]
            if not fes:
                return f"no frontend of {e.deployment} is running"
            fe = fes[0]
            # A person whose PATCH races a retune apply (409: the revision moved) reads again and
            # retries, as kubectl users do; three tries, since an apply writes each router once.
            for _ in range(3):
                current = httpx.get(fe.url + "/router_policy", timeout=5).json()
                r = httpx.patch(fe.url + "/router_policy", timeout=5,
                                json={"revision": current["revision"], "policy": dict(e.policy)})
                if r.status_code != 409:
                    break
            if r.status_code != 200:
                return f"the PATCH was refused: HTTP {r.status_code} {r.text[:100]}"
            target.append(fe.pod)
            self.log(f"scenario: PATCH /router_policy on {fe.pod}: " + ", ".join(f"{k} -> {v}" for k, v in e.policy.items()))
            return None

        def poll() -> tuple[bool, str]:
            fe = self.twin.frontends.get(target[0] if target else "")
            if fe is None:
                return False, "the frontend is gone"
            policy = fe.router.policy.model_dump()
            same = all(abs(policy[k] - v) <= 1e-9 for k, v in e.policy.items())
            seen = ", ".join(f"{k} now {policy[k]}" for k in e.policy) + f" (revision {fe.router.revision})"
            return (not same if e.expect == "reverted" else same), seen
        return start, poll

