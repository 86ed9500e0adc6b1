"""``powerfleet demo --scenario oversubscribe``: a rack oversubscribed 1.3x under the live guard
(issue 22 item 6; docs/power.md, "The twin scenario").

The twin: two nodes, both in rack-a (16 GPUs), no other tenants. Its two deployments start at
their initial sizes: ``llm-disagg`` (high priority) and ``llm-agg`` (low priority), 8 GPUs whose
pods request 4,300 W of caps. rack-a's limit is that sum / 1.3 (3,308 W), with
``oversubscription: 1.3``: the power guard keeps the guarded GPUs' measured draw under the limit
(beat runs ``powerfleet.power.guard`` every ``power.guard_period_s`` = 1 s), and the budget tick
admits requested caps up to 1.3 x the limit. Retune is off (nothing here needs it).

Steps (fractions of the run):

1. ``surge_throttled`` (15 %-45 %): the traffic's load on every worker x4 (the twin's
   ``load_scale``): at full load the GPUs would draw about 4.2 kW. Holds when the guard lowered
   the low-priority deployment's caps.
2. ``released`` (after the surge): every cap back at its pod's annotation (or its share under the
   guard's cap ceiling, ``power.guard.released_caps``: at 1.3x the default 1.25 holds llm-agg, low
   priority, a little below its annotation).
3. ``telemetry_loss_safe_caps`` (60 %-80 %): the second node's power telemetry is lost (NVML's
   power reading fails: its agent reports no draw). Holds when every guarded GPU of the node is
   at its safe cap (its share of the limit, power/safe.py).
4. ``recovered`` (after the loss): every cap back at its annotation (or ceiling share) again.

A poller reads the GPU files every 0.1 s (the caps in force, finer than the twin's 1 s samples)
and the lost node's report hash in Redis (the last report with a draw).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerfleet.power.guard import DEFAULT_CAP_CEILING, GroupRefused, GuardSettings, released_caps
from powerfleet.power.safe import GpuRange, safe_caps
from powerfleet.power.telemetry import REPORT_KEY
from powerfleet.twin.demo.checks import Check
from powerfleet.twin.cluster.manifests import AGG, DISAGG, INITIAL_CAPS, initial_replicas
from powerfleet.twin.demo.oversubscribe_checks import (TOLERANCE_W, CapChange, fallback_check, guarded_draw,
                                                  no_long_excursion, safe_bound_at)
from powerfleet.twin.runtime import Sample, Twin
from powerfleet.twin.demo.scenario import Step
from powerfleet.twin.cluster.topology import GPU_MAX_W, GPU_MIN_W, TwinSpec

NAME = "oversubscribe"
GROUP = "rack-a"
RATIO = 1.3
PRIORITY = {DISAGG: "high", AGG: "low"}
SURGE, SURGE_SCALE = (0.15, 0.45), 4.0
LOSS = (0.60, 0.80)
T2 = 0.98  # the guard's default throttle-all threshold (power.guard.GuardSettings)
GPUS_PER_REPLICA = {"prefill": 2, "decode": 2, "worker": 1}
POLL_S = 0.1


@dataclass(frozen=True)
class GuardPlan:
    """What the scenario does and to which rack: the shipped file ``scenarios/oversubscribe.yaml``
    (``plan_of``), or these defaults (the same figures)."""

    group: str = GROUP
    ratio: float = RATIO
    limit_w: float | None = None  # None: group_limit(spec)
    surge: tuple[float, float] = SURGE
    scale: float = SURGE_SCALE
    loss: tuple[float, float] = LOSS
    lost_node: str | None = None  # None: the rack's last node
    priority: tuple[tuple[str, str], ...] = tuple(PRIORITY.items())


def plan_of(scenario: Any) -> GuardPlan:
    """The guard's plan from a scenario file whose checks include ``power_guard`` (its one
    oversubscribed rack, its one ``set_load`` and one ``telemetry_fault``: scenario_model.py)."""
    from powerfleet.twin.demo.scenario_model import at_s

    group, rack = next((g, r) for g, r in scenario.topology.racks.items() if r.oversubscription > 1)
    d = float(scenario.duration_s)
    load = next(e for e in scenario.events if e.kind == "set_load")
    fault = next(e for e in scenario.events if e.kind == "telemetry_fault")
    surge0, loss0 = at_s(load.at, d) / d, at_s(fault.at, d) / d
    return GuardPlan(group, float(rack.oversubscription), None if rack.limit_w is None else float(rack.limit_w),
                     (surge0, surge0 + at_s(load.duration_s, d) / d), float(load.x),
                     (loss0, loss0 + at_s(fault.duration_s, d) / d), fault.node,
                     tuple((n, dep.budget.priority or "normal") for n, dep in scenario.deployments.items()))


def twin_spec(seed: int) -> TwinSpec:
    return TwinSpec(nodes=2, seed=seed, rack_a_nodes=2)


def requested_w(spec: TwinSpec) -> int:
    """The caps the deployments' pods request at their initial sizes."""
    reps = initial_replicas(spec)
    roles = [(DISAGG, "prefill"), (DISAGG, "decode"), (AGG, "worker")]
    return sum(reps[d][r] * GPUS_PER_REPLICA[r] * INITIAL_CAPS[r] for d, r in roles)


def group_limit(spec: TwinSpec) -> int:
    return int(round(requested_w(spec) / RATIO))


def fleet_values(twin: Twin, period_s: float = 1.0, plan: GuardPlan | None = None,
                 runner: str = "process") -> dict[str, str]:
    """The settings this scenario puts over the demo's (``demo_cmd.config_env`` form). ``runner``:
    who keeps the guard's periods (power.guard_runner): its own process by default, whose periods
    held their deadlines with both cores busy where beat's slipped (docs/power.md, "The bounds in seconds")."""
    plan = plan or GuardPlan()
    ns, top = twin.spec.namespace, twin.spec.total_gpus * GPU_MAX_W
    limit = int(plan.limit_w) if plan.limit_w is not None else group_limit(twin.spec)
    deployments = ", ".join(f"{ns}/{d}: {{power_limit_w: {top}, sole_writer: true, priority: {p}}}"
                            for d, p in plan.priority)
    return {"budget.groups": f"{{{plan.group}: {{limit_w: {limit}, oversubscription: {plan.ratio:g}}}}}",
            "budget.deployments": "{" + deployments + "}", "power.guard_period_s": str(period_s),
            "power.guard_runner": runner,
            "retune.deployments": "[]"}


@dataclass
class Record:
    """What the poller saw."""

    changes: list[CapChange] = field(default_factory=list)
    caps: dict[tuple[str, int], float] = field(default_factory=dict)  # the caps in force now
    loss_caps: dict[tuple[str, int], float] = field(default_factory=dict)  # the caps in force at the loss
    last_report_at: float | None = None  # the lost node's newest report with a draw, before the loss
    loss_at: float | None = None
    loss_end: float | None = None
    surge_at: float | None = None
    surge_end: float | None = None


class OversubscribeScenario:
    """The same driving interface as ``twin.demo.scenario.Scenario`` (tick, finish, states, steps)."""

    def __init__(self, twin: Twin, redis_client: Any, log: Callable[[str], None], period_s: float = 1.0,
                 plan: GuardPlan = GuardPlan(), cap_ceiling: float | None = DEFAULT_CAP_CEILING) -> None:
        self.twin, self.r, self.log, self.period_s, self.plan = twin, redis_client, log, period_s, plan
        self.cap_ceiling = cap_ceiling  # the fleet's power.cap_ceiling (the default unless overridden)
        self.limit_w = float(plan.limit_w if plan.limit_w is not None else group_limit(twin.spec))
        self.nodes = list(twin.spec.racks[plan.group])
        self.lost_node = plan.lost_node or self.nodes[-1]
        self.priority = dict(plan.priority)
        self.rec = Record()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._reported: dict[str, tuple[float, ...]] = {}
        self.steps = [
            Step("surge_throttled", plan.surge[0], self._start_surge, self._poll_surge),
            Step("released", plan.surge[1], self._end_surge, self._poll_annotations),
            Step("telemetry_loss_safe_caps", plan.loss[0], self._start_loss, self._poll_loss),
            Step("recovered", plan.loss[1], self._end_loss, self._poll_annotations),
        ]

    # -- driving (DemoRun calls these) --

    def tick(self, fraction: float) -> None:
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_loop, name="oversubscribe-poll", daemon=True)
            self._poller.start()
        for step in self.steps:
            o = step.outcome
            if o.state == "pending" and fraction >= step.at:
                o.state = "running" if step.start() is None else "failed"
            if o.state == "running":
                holds, seen = step.poll()
                o.detail = seen
                if holds:
                    o.state = "ok"
                    self.log(f"scenario {step.name}: held ({seen})")
        self._news()

    def finish(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
        for step in self.steps:
            o = step.outcome
            if o.state in ("pending", "running"):
                o.state, o.detail = "failed", f"not reached before the end; last seen: {o.detail or 'nothing'}"
        self.twin.load_scale.clear()
        self.twin.nodes[self.lost_node].telemetry_lost = False

    def states(self) -> dict[str, str]:
        return {s.name: s.outcome.text() for s in self.steps}

    def retune_history(self) -> dict[str, list[dict[str, Any]]]:
        return {}  # retune is off in this scenario

    # -- what the view shows: the guarded draw against the limit --

    def view_power(self, s: Sample) -> tuple[dict[str, float], dict[str, float]]:
        g = self.plan.group
        return {f"{g} guarded": round(guarded_draw(s, self.nodes), 1)}, {f"{g} guarded": self.limit_w}

    def _news(self) -> None:
        """One decision line per change of a deployment's caps in force (who, by how much)."""
        samples = self.twin.snapshot_samples()
        if not samples:
            return
        s = samples[-1]
        caps: dict[str, list[float]] = {}
        for g in s.gpus:
            if g.pod is not None and g.node in self.nodes:
                caps.setdefault(self._dgd(g.pod), []).append(g.cap_w)
        for dgd, values in sorted(caps.items()):
            now = tuple(sorted(values))
            before = self._reported.get(dgd)
            self._reported[dgd] = now
            if before is None or _span(before) == _span(now):
                continue
            self.log(f"guard {self.plan.group}: {dgd} ({self.priority.get(dgd, 'high')} priority) caps {_span(before)} -> "
                     f"{_span(now)} on {len(now)} GPUs (guarded draw {guarded_draw(s, self.nodes):.0f} W, "
                     f"limit {self.limit_w:.0f} W)")

    def _dgd(self, pod: str) -> str:
        return next((d for d in sorted(self.priority, key=len, reverse=True) if pod.startswith(d + "-")), pod)

    # -- the steps --

    def _start_surge(self) -> str | None:
        self.twin.load_scale.update({d: self.plan.scale for d in self.priority})
        self.rec.surge_at = time.time()
        self.log(f"scenario: demand surge: every worker's load x{self.plan.scale:g}")
        return None

    def _poll_surge(self) -> tuple[bool, str]:
        low = self._throttled(AGG)
        high = self._throttled(DISAGG)
        return bool(low), f"GPUs below their annotation: {AGG} (low) {len(low)}, {DISAGG} (high) {len(high)}"

    def _end_surge(self) -> str | None:
        self.twin.load_scale.clear()
        self.rec.surge_end = time.time()
        self.log("scenario: the surge ends")
        return None

    def _poll_annotations(self) -> tuple[bool, str]:
        below = self._throttled(AGG) + self._throttled(DISAGG)
        return not below, f"{len(below)} guarded GPUs below their annotation (or cap-ceiling share)"

    def _start_loss(self) -> str | None:
        with self._lock:
            self.rec.loss_caps = dict(self.rec.caps)
            self.rec.loss_at = time.time()
        self.twin.nodes[self.lost_node].telemetry_lost = True
        self.log(f"scenario: {self.lost_node}'s power telemetry is lost (NVML's power reading fails)")
        return None

    def _poll_loss(self) -> tuple[bool, str]:
        safe = self.safe_caps(self.lost_node)
        with self._lock:
            caps = {k: self.rec.caps.get(k) for k in safe}
        at = [k for k, w in safe.items() if caps[k] is not None and abs(caps[k] - w) <= TOLERANCE_W]  # type: ignore[operator]
        return len(at) == len(safe) and bool(safe), (
            f"{len(at)} of {len(safe)} GPUs of {self.lost_node} at their safe caps "
            f"({', '.join(f'{w:.0f}' for w in sorted(set(safe.values())))} W)")

    def _end_loss(self) -> str | None:
        self.twin.nodes[self.lost_node].telemetry_lost = False
        self.rec.loss_end = time.time()
        self.log(f"scenario: {self.lost_node}'s power telemetry is back")
        return None

    # -- figures --

    def _pod_gpus(self, s: Sample | None = None) -> list[Any]:
        samples = [s] if s is not None else self.twin.snapshot_samples()[-1:]
        return [g for x in samples for g in x.gpus if g.pod is not None and g.node in self.nodes]

    def _throttled(self, dgd: str) -> list[Any]:
        """``dgd``'s guarded GPUs below the cap the guard leaves once released (``released_caps``)."""
        samples = self.twin.snapshot_samples()
        if not samples:
            return []
        s = samples[-1]
        released = self.released_caps(s)
        return [g for g in self._pod_gpus(s) if self._dgd(g.pod) == dgd
                and (want := released.get(f"{g.node}/{g.index}")) and g.cap_w < want - TOLERANCE_W]

    def released_caps(self, s: Sample) -> dict[str, float]:
        """Each guarded GPU's cap once the guard has released every throttle: its annotation, or its
        share under the cap ceiling (power.guard.released_caps: low priority cut first)."""
        gpus = {f"{g.node}/{g.index}": (self.priority.get(self._dgd(g.pod), "high"),
                                        GpuRange(want, GPU_MIN_W, GPU_MAX_W))
                for g in self._pod_gpus(s) if (want := s.annotated_w.get(f"{g.node}/{g.index}"))}
        settings = GuardSettings(period_s=self.period_s, cap_ceiling=self.cap_ceiling)
        try:
            return released_caps(settings, self.plan.group, self.limit_w, gpus) if gpus else {}
        except GroupRefused:  # the guard refuses the group (its minimums do not fit): nothing is throttled
            return {k: r.cap_w for k, (_, r) in gpus.items()}

    def safe_caps(self, node: str, samples: list[Sample] | None = None, t: float | None = None
                  ) -> dict[tuple[str, int], float]:
        """The safe cap of each guarded GPU of ``node`` (its share of the limit among every guarded
        GPU, power/safe.py), from the sample at ``t`` (default: the last one)."""
        samples = samples if samples is not None else self.twin.snapshot_samples()
        at = [x for x in samples if t is None or x.t <= t] or samples[:1]
        if not at:
            return {}
        s = at[-1]
        ranges = {f"{g.node}/{g.index}": GpuRange(want, GPU_MIN_W, GPU_MAX_W) for g in self._pod_gpus(s)
                  if (want := s.annotated_w.get(f"{g.node}/{g.index}"))}
        return {(k.split("/")[0], int(k.split("/")[1])): w for k, w in safe_caps(ranges, self.limit_w).items()
                if k.startswith(node + "/")}

    # -- the poller --

    def _poll_loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._poll_once()
            except Exception:  # noqa: BLE001 - a read that failed is retried at the next poll
                continue

    def _poll_once(self) -> None:
        now = time.time()
        for node in self.nodes:
            for d in self.twin.nodes[node].backend.devices():
                cap = float(d.current_w or d.default_w)
                key = (node, d.index)
                with self._lock:
                    old = self.rec.caps.get(key)
                    if old is not None and abs(old - cap) > TOLERANCE_W:
                        self.rec.changes.append(CapChange(now, node, d.index, old, cap))
                    self.rec.caps[key] = cap
        if self.rec.loss_at is None or self.rec.loss_end is None:
            raw = self.r.hgetall(REPORT_KEY.format(node=self.lost_node)) or {}
            ats = []
            for v in raw.values():
                try:
                    rep = json.loads(v)
                    if rep.get("draw_w") is not None and rep.get("pods"):
                        ats.append(float(rep["at"]))
                except (ValueError, TypeError, KeyError, AttributeError):
                    continue
            if ats and (self.rec.loss_at is None or max(ats) <= (self.rec.loss_end or now)):
                with self._lock:
                    self.rec.last_report_at = max(ats)

    # -- the checks (DemoRun adds no_unexpected_task_failures) --

    def checks(self, samples: list[Sample]) -> list[Check]:
        with self._lock:
            rec = Record(list(self.rec.changes), dict(self.rec.caps), dict(self.rec.loss_caps),
                         self.rec.last_report_at, self.rec.loss_at, self.rec.loss_end)
        bound = None
        if rec.loss_at is not None:
            bound = safe_bound_at(rec.changes, rec.loss_caps, self.safe_caps(self.lost_node, samples, rec.loss_at), rec.loss_at)
            if bound is not None and rec.loss_end is not None and bound > rec.loss_end:
                bound = None
        # The guard's reaction time (draw above t2 -> a lowered cap) is a figure, in the report and
        # bench/oversubscribe.py, not a check: under a loaded machine it is a timing, not a property.
        out = [no_long_excursion(samples, self.nodes, self.limit_w, self.period_s, self.twin.options.tick_s),
               fallback_check(rec.loss_at, rec.last_report_at, bound, self.period_s)]
        out += [Check(s.name, s.outcome.state == "ok", s.outcome.detail) for s in self.steps]
        return out

    def dgd_of(self, samples: list[Sample]) -> dict[str, str]:
        return {g.pod: self._dgd(g.pod) for s in samples for g in s.gpus if g.pod is not None}


def _span(caps: tuple[float, ...]) -> str:
    lo, hi = min(caps), max(caps)
    return f"{lo:.0f} W" if abs(hi - lo) < TOLERANCE_W else f"{lo:.0f}-{hi:.0f} W"

