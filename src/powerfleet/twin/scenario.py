"""The demo's scripted scenario: what a user does to the twin, and how the demo sees the fleet respond.

Each step starts at a fraction of the run and is then polled once a second until it holds
or the run ends: it acts the way a person would (edit a DGD, send a task through the task
API, PATCH a router by hand) and judges only by what the cluster, the GPUs and the routers
show afterwards. A step whose capability is not in this build (its task is not registered)
fails at once with that reason: it is never skipped silently or faked.

Steps:
1. ``cap_change``: the decode component of ``llm-disagg`` gets a lower power annotation;
   the operator rolls its pods; holds when every GPU of the new pods runs at the new cap.
2. ``scale_up_clamped``: the deployment is re-admitted after step 1's drift, then
   ``budget.propose`` asks for one prefill replica less and more decode replicas than the
   rack budget and the GPUs allow; holds when decode grew but stayed below the proposal, the
   planner gave a power or GPU-capacity reason, and it staged the rebalance (scale-down first,
   scale-up next evaluation) because its transition would exceed the watts or the free GPUs.
3. ``retune_applied``: at least one retune window was decided and applied to the routers.
4. ``manual_change_reverted``: once retune has applied a decision, someone PATCHes a router
   by hand; holds when retune puts the decided settings back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from powerfleet.cluster.budget_store import status_object_name, stored_status
from powerfleet.cluster.dgd import DGD_API_VERSION, DGD_KIND, LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION
from powerfleet.twin.apiserver.errors import ApiError
from powerfleet.twin.manifests import AGG, DISAGG
from powerfleet.twin.runtime import Twin

NEW_DECODE_CAP_W = 380
MANUAL_TEMPERATURE = 0.9
RETUNE_STATE_SUFFIX = "-powerfleet-retune-state"
DECIDED = ("apply", "keep", "no-traffic", "advisory", "promoted")
WAIT = "wait"  # a step's start() asking to be tried again at the next tick


@dataclass
class Outcome:
    state: str = "pending"  # pending | running | ok | failed
    detail: str = ""

    def text(self) -> str:
        return self.state if self.state in ("pending", "running", "ok") else f"failed: {self.detail}"


@dataclass
class Step:
    name: str
    at: float  # fraction of the run
    start: Callable[[], str | None]  # returns a failure reason, or None when started
    poll: Callable[[], tuple[bool, str]]  # (holds, what was seen)
    outcome: Outcome = field(default_factory=Outcome)


class Scenario:
    def __init__(self, twin: Twin, send: Callable[[str, dict[str, Any]], None], has_task: Callable[[str], bool],
                 log: Callable[[str], None]) -> None:
        self.twin, self.send, self.has_task, self.log = twin, send, has_task, log
        self._proposed: int | None = None
        self._initial_decode = 0
        self._manual_frontend: str | None = None
        self._reasons: set[str] = set()
        self._initial_prefill = 0
        self._replica_steps: list[tuple[int, int]] = []
        self.steps = [
            Step("cap_change", 0.08, self._start_cap, self._poll_cap),
            Step("scale_up_clamped", 0.25, self._start_scale, self._poll_scale),
            Step("retune_applied", 0.0, self._start_retune, self._poll_retune),
            Step("manual_change_reverted", 0.6, self._start_manual, self._poll_manual),
        ]

    # -- driving --

    def tick(self, fraction: float) -> None:
        for step in self.steps:
            o = step.outcome
            if o.state == "pending" and fraction >= step.at:
                try:
                    reason = step.start()
                except Exception as exc:  # noqa: BLE001 - a refused send is this step's failure, not the run's
                    reason = f"{type(exc).__name__}: {exc}"
                if reason == WAIT:
                    o.detail = "waiting for a retune decision to be applied first"
                    continue
                if reason is not None:
                    o.state, o.detail = "failed", reason
                    self.log(f"scenario {step.name}: cannot run: {reason}")
                else:
                    o.state = "running"
            if o.state == "running":
                try:
                    holds, seen = step.poll()
                except Exception as exc:  # noqa: BLE001 - a probe error is "not yet", recorded
                    holds, seen = False, f"{type(exc).__name__}: {exc}"
                o.detail = seen
                if holds:
                    o.state = "ok"
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

    # -- helpers --

    def _dgd(self, name: str) -> dict[str, Any]:
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

    def _pods(self, dgd: str, component: str) -> list[dict[str, Any]]:
        return [p for p in self.twin.api.list("v1", "Pod", self.twin.spec.namespace)
                if (p["metadata"].get("labels") or {}).get(LABEL_DGD_NAME) == dgd
                and p["metadata"]["labels"].get(LABEL_COMPONENT) == component]

    # -- 1. cap change --

    def _start_cap(self) -> str | None:
        self.twin.set_component_cap(DISAGG, "decode", NEW_DECODE_CAP_W)
        self.log(f"scenario: {DISAGG}/decode power annotation -> {NEW_DECODE_CAP_W} W (the operator rolls its pods)")
        return None

    def _poll_cap(self) -> tuple[bool, str]:
        pods = self._pods(DISAGG, "decode")
        names = {p["metadata"]["name"] for p in pods}
        annotated = all((p["metadata"].get("annotations") or {}).get(POWER_ANNOTATION) == str(NEW_DECODE_CAP_W)
                        for p in pods)
        samples = self.twin.snapshot_samples()
        gpus = [g for g in samples[-1].gpus if g.pod in names] if samples else []
        caps = sorted({g.cap_w for g in gpus})
        ok = bool(pods) and annotated and bool(gpus) and caps == [float(NEW_DECODE_CAP_W)]
        return ok, f"{len(pods)} decode pods, annotated {annotated}, caps on their GPUs {caps}"

    # -- 2. scale-up clamped by the rack budget --

    def _start_scale(self) -> str | None:
        if not self.has_task("powerfleet.budget.propose"):
            return "powerfleet.budget.propose is not a task in this build (budget planner absent)"
        services = self._dgd(DISAGG)["spec"]["services"]
        self._initial_decode = int(services["decode"].get("replicas", 1))
        self._initial_prefill = int(services["prefill"].get("replicas", 1))
        # A rebalance towards decode: one prefill replica less, and enough 2-GPU decode replicas
        # to fill every GPU (far above any rack budget). The planner clamps the decode side to
        # the budget and, when the transition peak would not fit, stages it: the scale-down
        # first, the scale-up at the next evaluation.
        self._proposed = self._initial_decode + self.twin.spec.total_gpus // 2
        proposal = {"decode": self._proposed}
        if self._initial_prefill > 1:
            proposal["prefill"] = self._initial_prefill - 1
        deployment = f"{self.twin.spec.namespace}/{DISAGG}"
        if self.has_task("powerfleet.budget.readmit"):
            # The cap change was drift against what the planner admitted: it failed this deployment
            # closed. An operator re-admits it once the new caps are rolled out (docs/budget.md).
            self.send("powerfleet.budget.readmit", {"deployment": deployment})
            self.log(f"scenario: budget.readmit {deployment} (new caps rolled out)")
        self.send("powerfleet.budget.propose", {"deployment": deployment, "replicas": proposal})
        self.log(f"scenario: budget.propose {DISAGG} " + ", ".join(
            f"{role} {self._initial_prefill if role == 'prefill' else self._initial_decode} -> {n}"
            for role, n in proposal.items()))
        return None

    def _poll_scale(self) -> tuple[bool, str]:
        services = self._dgd(DISAGG)["spec"]["services"]
        decode = int(services["decode"].get("replicas", 0))
        prefill = int(services["prefill"].get("replicas", 0))
        if not self._replica_steps or self._replica_steps[-1] != (prefill, decode):
            self._replica_steps.append((prefill, decode))
        budget = self.budget_status(DISAGG)
        self._reasons.update(r for r in budget.get("reasons", []) if isinstance(r, str))
        assert self._proposed is not None
        # The proposal fills every GPU: the watts or the GPUs the nodes have free stop it
        # (budget/capacity.py), whichever binds first on this twin.
        clamped = any(r.startswith("power_") or r == "gpu_capacity" for r in self._reasons)
        staged = bool({"power_rebalance_staged", "gpu_rebalance_staged"} & self._reasons)
        ok = self._initial_decode < decode < self._proposed and clamped and (staged or self._initial_prefill <= 1)
        steps = " -> ".join(f"({p}, {d})" for p, d in self._replica_steps)
        return ok, (f"(prefill, decode) replicas {steps}; decode proposed {self._proposed}; "
                    f"{'staged' if staged else 'not staged'}; planner reasons seen {sorted(self._reasons)}")

    # -- 3. retune decisions --

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

    def _start_retune(self) -> str | None:
        if not self.has_task("powerfleet.retune.harvest"):
            return "powerfleet.retune.harvest is not a task in this build (live retune absent)"
        return None

    def _poll_retune(self) -> tuple[bool, str]:
        hist = self.retune_history()
        applied = [(d, h.get("window")) for d, hs in hist.items() for h in hs if h.get("outcome") == "apply"]
        decided = sum(1 for hs in hist.values() for h in hs if h.get("outcome") in DECIDED)
        return bool(applied), f"{decided} windows decided, {len(applied)} applied"

    # -- 4. a manual router change, reverted --

    def _start_manual(self) -> str | None:
        if not self.has_task("powerfleet.retune.apply"):
            return "powerfleet.retune.apply is not a task in this build (router actuation absent)"
        if self.steps[2].outcome.state != "ok":
            # Retune restores the settings it decided; until one was applied there are none to restore.
            return WAIT
        fes = [f for f in self.twin.frontends.values() if f.dgd == AGG] or list(self.twin.frontends.values())
        if not fes:
            return "no frontend is running"
        fe = fes[0]
        current = httpx.get(fe.url + "/router_policy", timeout=5).json()
        r = httpx.patch(fe.url + "/router_policy", timeout=5,
                        json={"revision": current["revision"], "policy": {"temperature": MANUAL_TEMPERATURE}})
        if r.status_code != 200:
            return f"the manual PATCH was refused: HTTP {r.status_code} {r.text[:100]}"
        self._manual_frontend = fe.pod
        self.log(f"scenario: manual PATCH /router_policy on {fe.pod}: temperature -> {MANUAL_TEMPERATURE}")
        return None

    def _poll_manual(self) -> tuple[bool, str]:
        fe = self.twin.frontends.get(self._manual_frontend or "")
        if fe is None:
            return False, "the frontend is gone"
        policy = fe.router.policy.model_dump()
        ok = abs(policy["temperature"] - MANUAL_TEMPERATURE) > 1e-9
        return ok, f"temperature now {policy['temperature']} (revision {fe.router.revision})"
