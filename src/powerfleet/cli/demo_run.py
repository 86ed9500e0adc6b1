"""One demo run: wait for the fleet, drive the scenario, feed the live view, then judge and report."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from powerfleet.beat.ticklog import TickLog
from powerfleet.config import FleetConfig
from powerfleet.queues import CONTROL_QUEUE, SWEEP_QUEUE, node_queue
from powerfleet.twin.demo import checks as C
from powerfleet.twin.demo import scenario_checks as SC
from powerfleet.twin.demo.report import summary as build_summary
from powerfleet.twin.demo.report import write_report
from powerfleet.twin.runtime import Twin
from powerfleet.twin.demo.scenario import DECIDED
from powerfleet.twin.demo.view import ViewState, clock, decision_text, make_view, tick_news, window_span

FLEET_UP_TIMEOUT_S = 120.0


@dataclass
class DemoRun:
    twin: Twin
    launcher: Any
    config: FleetConfig
    broker_url: str
    flower_url: str
    duration_s: float
    window_s: int
    plain: bool
    stop: threading.Event
    work: Path
    meta: dict[str, Any]
    state: ViewState = field(default_factory=ViewState)
    summary: dict[str, Any] = field(default_factory=dict)
    fleet_up_at: float | None = None
    first_reconcile_at: float | None = None
    ended_at: float = 0.0
    _ticks_seen: dict[str, float] = field(default_factory=dict)
    _tick_detail: dict[str, str] = field(default_factory=dict)
    _budget_seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (wall-clock time, what happened)
    _decisions_seen: set[tuple[str, int, str]] = field(default_factory=set)
    _launched: set[tuple[str, int]] = field(default_factory=set)
    ledger: list[dict[str, Any]] | None = None  # the budget ticks' group figures, read at the end of the run
    plan: Any = None  # the scenario file (twin/demo/scenario_model.py)
    ports: dict[str, dict[str, str]] = field(default_factory=dict)  # each process's metrics port settings
    reasons_seen: dict[str, set[str]] = field(default_factory=dict)  # deployment -> the budget's reasons seen
    reasons_at: dict[str, list[tuple[float, list[str]]]] = field(default_factory=dict)  # ... and when each changed

    def __post_init__(self) -> None:
        from powerfleet.workers.app import create_app

        self.app = create_app(self.config, self.broker_url)
        self.redis = redis.Redis.from_url(self.broker_url, socket_timeout=5)
        self.ticklog = TickLog(self.redis)
        if "power_guard" not in self.plan.checks:
            from powerfleet.cli.demo_fleet import DemoFleet
            from powerfleet.twin.demo.scenario_events import ScenarioRun

            fleet = DemoFleet(self.app, self.redis, self.launcher, self.twin, self.work, self.plan, self.ports)
            self.scenario: Any = ScenarioRun(self.plan, self.twin, fleet, self._decision)
        else:  # issue 22 item 6 (twin/demo/oversubscribe.py): the guard's own steps and checks
            from powerfleet.twin.demo.oversubscribe import OversubscribeScenario, plan_of

            self.scenario = OversubscribeScenario(self.twin, self.redis, self._decision,
                                                  self.config.power.guard_period_s, plan_of(self.plan))
        budgets = self.twin.budgets
        self.state = ViewState(duration_s=self.duration_s, flower_url=self.flower_url, rack_budget_w=budgets,
                               fleet_budget_w=sum(budgets.values()))

    def _decision(self, line: str) -> None:
        now = time.time()
        self.timeline.append((now, line))
        self.state.decisions.append(f"{clock(now)}  {line}")

    def _window_span(self, k: int) -> str:
        return window_span(k, self.window_s)

    def _tick_news(self, family: str, detail: str) -> str | None:
        news = tick_news(family, detail, self._tick_detail.get(family), self.window_s)
        self._tick_detail[family] = detail
        return news

    # -- the run --

    def run(self) -> str | None:
        """Returns None when the run went its length, else why it stopped early."""
        view = make_view(self.plain)
        with view:
            reason = self._wait_for_fleet(view)
            if reason is None:
                reason = self._scenario(view)
        self.ended_at = time.time()
        self.ledger = self._ledger_history()  # read now: the broker stops before the report is written
        return reason

    def _ledger_history(self) -> list[dict[str, Any]] | None:
        """The budget ticks' recorded group figures, for the report's ledger plot (None: unreadable)."""
        from powerfleet.budget.state import BudgetState

        try:
            return BudgetState(self.redis).group_history()
        except redis.RedisError:
            return None

    def _expected_workers(self) -> int:
        return 3 + len(self.twin.spec.node_names)

    def _wait_for_fleet(self, view: Any) -> str | None:
        started = time.time()
        self._decision(f"waiting for {self._expected_workers()} workers to answer a ping")
        while not self.stop.is_set():
            dead = self._dead()
            if dead:
                return dead
            try:
                replies = self.app.control.ping(timeout=1.0) or []
            except Exception:  # noqa: BLE001 - the broker may still be warming up
                replies = []
            if len(replies) >= self._expected_workers():
                self.fleet_up_at = time.time()
                self._decision(f"fleet up after {self.fleet_up_at - started:.0f} s: {len(replies)} workers")
                return None
            if time.time() - started > FLEET_UP_TIMEOUT_S:
                return f"only {len(replies)} of {self._expected_workers()} workers answered within {FLEET_UP_TIMEOUT_S:.0f} s"
            self._refresh(view, started)
        return "interrupted"

    def _scenario(self, view: Any) -> str | None:
        assert self.fleet_up_at is not None
        while not self.stop.is_set():
            elapsed = time.time() - self.fleet_up_at
            if elapsed >= self.duration_s:
                return None
            dead = self._dead()
            if dead:
                return dead
            self.scenario.tick(elapsed / self.duration_s)
            self._refresh(view, self.fleet_up_at)
            self.stop.wait(1.0)
        return "interrupted"

    def _dead(self) -> str | None:
        dead = self.launcher.dead_children()
        if dead:
            return "a fleet process stopped: " + ", ".join(f"{c.name} (exit {c.proc.returncode}, log {c.log})" for c in dead)
        return None

    # -- what the view shows --

    def _refresh(self, view: Any, since: float) -> None:
        s = self.state
        s.now = time.time()
        s.elapsed_s = s.now - since
        samples = self.twin.snapshot_samples()
        if samples:
            last = samples[-1]
            s.fleet_w, s.rack_w = last.fleet_w, dict(last.rack_w)
            if last.rack_budget_w:  # the limits in force (a set_limit moves them)
                s.rack_budget_w, s.fleet_budget_w = dict(last.rack_budget_w), sum(last.rack_budget_w.values())
            caps: dict[str, list[float]] = {}
            for g in last.gpus:
                caps.setdefault(g.node, []).append(g.cap_w)
            s.caps = caps
            if hasattr(self.scenario, "view_power"):  # the guarded draw against the limit
                s.rack_w, s.rack_budget_w = self.scenario.view_power(last)
        queues = [CONTROL_QUEUE, SWEEP_QUEUE] + [node_queue(n) for n in self.twin.spec.node_names]
        try:
            with self.redis.pipeline() as p:
                for q in queues:
                    p.llen(q)
                s.queues = dict(zip(queues, (int(n) for n in p.execute())))
            for family, at in self.ticklog.last_ticks().items():
                if self._ticks_seen.get(family) != at:
                    self._ticks_seen[family] = at
                    if family == "reconcile" and self.first_reconcile_at is None:
                        self.first_reconcile_at = at
                    news = self._tick_news(family, self.ticklog.last_details().get(family, ""))
                    if news:
                        self._decision(news)
                    else:
                        s.quiet_ticks[family] = s.quiet_ticks.get(family, 0) + 1
            self._budget_news()
            for key in self.redis.scan_iter(match="powerfleet:retune:launched:*", count=500):
                _, _, _, dgd, k = key.decode().split(":", 4)
                self._launched.add((dgd, int(k)))
        except redis.RedisError:
            pass
        for dgd, hist in self.scenario.retune_history().items():
            for h in hist:
                key = (dgd, int(h.get("window", -1)), str(h.get("outcome")))
                if key not in self._decisions_seen:
                    self._decisions_seen.add(key)
                    reason = _reason_text(key[2], str(h.get("reason") or ""), self.window_s)
                    self._decision(f"retune {dgd} window {self._window_span(key[1])}: {key[2]}{reason}")
        s.steps = self.scenario.states()
        view.update(s)

    def _budget_news(self) -> None:
        """A budget evaluation whose verdict or limit changed: the clamp, the limit and what it leaves."""
        from powerfleet.budget.state import BudgetState
        from powerfleet.twin.demo.report import budget_event

        for dgd, fig in sorted(BudgetState(self.redis).figures().items()):
            status = self._budget_status(dgd)
            # A new line when the verdict, the limit or the clamp's reasons change.
            seen = (fig.get("reason"), fig.get("limit_w"), tuple(status.get("reasons") or ()))
            if self._budget_seen.get(dgd) == seen:
                continue
            self._budget_seen[dgd] = seen
            now_reasons = [r for r in status.get("reasons") or () if isinstance(r, str)]
            self.reasons_seen.setdefault(dgd.partition("/")[2] or dgd, set()).update(now_reasons)
            self.reasons_at.setdefault(dgd.partition("/")[2] or dgd, []).append((time.time(), now_reasons))
            if status.get("powerLimitWatts") is not None:  # the persisted evaluation: limit and share
                self._decision(budget_event(dgd, status, self.twin.budgets))
                continue
            watts = ", ".join(f"{label} {fig[k]} W" for k, label in (("limit_w", "limit"), ("settled_w", "settled"),
                                                                     ("peak_w", "peak")) if fig.get(k) is not None)
            gpus = f" on {fig['gpus']} GPUs" if fig.get("gpus") is not None else ""
            self._decision(f"budget {dgd}: {fig.get('reason')}" + (f" ({watts}{gpus})" if watts else ""))

    def _budget_status(self, dgd: str) -> dict[str, Any]:
        """The status the evaluation persisted for ``ns/name`` (empty when it cannot be read)."""
        try:
            return self.scenario.budget_status(dgd.partition("/")[2] or dgd)
        except Exception:  # noqa: BLE001 - the line falls back to the figures in Redis
            return {}

    # -- judging and the report --

    def _log_lines(self) -> list[tuple[str, str]]:
        out = []
        for log in sorted((self.work / "logs").glob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                out.append((log.stem, line))
        return out

    def _samples(self) -> list[Any]:
        """Samples up to the end of the run: at shutdown the agents restore default caps, by design."""
        end = self.ended_at or time.time()
        return [s for s in self.twin.snapshot_samples() if s.t <= end]

    def judge(self) -> list[C.Check]:
        self.scenario.finish()
        samples = self._samples()
        budgets = self.twin.budgets
        # One reconcile interval, plus the twin's sampling period either side and a pass's own time.
        lag = self.config.beat.reconcile_interval_s + 2 * self.twin.options.tick_s + 2.0
        if hasattr(self.scenario, "checks"):  # a scenario with its own checks (twin/demo/oversubscribe.py)
            return [*self.scenario.checks(samples), C.no_task_failures(self._log_lines())]
        history = self.scenario.retune_history()
        outcomes = {(d, int(h["window"])): str(h.get("outcome")) for d, hs in history.items() for h in hs
                    if isinstance(h.get("window"), int)}
        # A window launched within its time budget of the end may still be sweeping: not judged.
        budget_s = self.window_s * 0.8 + self.window_s
        running = [(d, k) for d, k in self._launched if (k + 1) * self.window_s > self.ended_at - budget_s]
        abandoned = {(d, int(h["window"])): f"{d} window {window_span(int(h['window']), self.window_s)}: "
                     + _reason_text("abandoned", str(h.get("reason") or ""), self.window_s).removeprefix(" - ")
                     for d, hs in history.items() for h in hs
                     if isinstance(h.get("window"), int) and h.get("outcome") == "abandoned"}
        rack_of = {n: self.twin.spec.rack_of(n) for n in self.twin.spec.node_names}
        racks_of = {d: set(rack_of.values()) for d in self.plan.deployments}
        slas = {d: float(x.sla.ttft_ms) for d, x in self.plan.deployments.items() if x.sla is not None}
        itl = {d: float(x.sla.itl_ms) for d, x in self.plan.deployments.items()
               if x.sla is not None and x.sla.itl_ms is not None}
        from powerfleet.twin.demo.scenario_model import at_s

        since = {d: (self.fleet_up_at or 0.0) + at_s(x.sla.judged_from, self.plan.duration_s)
                 for d, x in self.plan.deployments.items() if x.sla is not None}
        made = {
            "power_within_budget": lambda: C.power_within_budget(samples, budgets, sum(budgets.values())),
            # Judged once the agents had their first pass (a reconcile tick and its lag): before it, a GPU
            # runs at its default limit whatever its pod asks, and no agent has been asked to act.
            "no_rack_over_limit": lambda: SC.no_rack_over_limit(
                samples, rack_of, budgets, since=(self.first_reconcile_at or self.fleet_up_at or 0.0) + lag),
            # Judged from the first reconcile tick: before it no agent has been asked to act.
            "caps_match_annotations": lambda: C.caps_match_annotations(
                samples, lag, since=self.first_reconcile_at or self.fleet_up_at),
            "retune_windows_decided": lambda: C.windows_decided(self._launched, outcomes, running, DECIDED, abandoned),
            "retune_applied": lambda: SC.retune_applied(history),
            "no_unexpected_task_failures": lambda: C.no_task_failures(self._log_lines()),
            "slo": lambda: SC.slo(self.twin.snapshot_windows(), slas, self.reasons_seen, racks_of, since, itl,
                                  self.reasons_at, float(self.window_s)),
        }
        checks = [made[name]() for name in self.plan.checks if name in made]
        if "events" in self.plan.checks:
            checks += [C.Check(step.name, step.outcome.state == "ok", step.outcome.detail)
                       for step in self.scenario.steps]
        return checks

    def write_report(self, out: Path) -> Path:
        checks = self.judge()
        self.state.steps = self.scenario.states()
        samples = self._samples()
        windows = self.twin.snapshot_windows()
        extra = {**self.meta, "traffic": self.twin.traffic_source, "speedup": self.twin.options.speedup,
                 "flower_url": self.flower_url, "work_dir": str(self.work),
                 "fleet_up_s": None if self.fleet_up_at is None else round(self.fleet_up_at - samples[0].t, 1)
                 if samples else None,
                 "steps": self.scenario.states(), "view": self.state.to_json(),
                 "launched_windows": sorted(f"{d}#{k}" for d, k in self._launched),
                 "twin": {"tick_errors": self.twin.tick_errors, "last_tick_error": self.twin.last_tick_error,
                          "dropped_requests": self.twin.dropped},
                 # The twin drops a request only when no frontend pod of its deployment runs.
                 "dropped_requests": {d: {"requests": n, "cause": "no frontend pod of the deployment was running"}
                                      for d, n in sorted(self.twin.dropped.items()) if n}}
        self.summary = build_summary(samples=samples, windows=windows, checks=checks,
                                     rack_budget_w=self.twin.budgets, fleet_budget_w=sum(self.twin.budgets.values()),
                                     extra=extra, events=self.timeline)
        if hasattr(self.scenario, "at_s"):  # a ScenarioRun (the guard's scenario has its own section)
            from powerfleet.twin.demo.scenario_report import scenario_result

            self.summary["scenario_result"] = scenario_result(
                self.plan, self.meta.get("scenario_file"), self.scenario.steps, self.scenario.at_s, checks,
                self.ledger, self.fleet_up_at or (samples[0].t if samples else 0.0))
        racks = {n: self.twin.spec.rack_of(n) for n in self.twin.spec.node_names}
        index = write_report(out, self.summary, samples, windows, self.twin.budgets, racks,
                             ledger=self.ledger)
        if "power_guard" in self.plan.checks:
            from powerfleet.twin.demo.oversubscribe_report import extend

            extend(out, self.summary, samples, self.scenario)
        return index


def _reason_text(outcome: str, reason: str, window_s: int) -> str:
    """`` - <reason>`` without the outcome said twice (``keep: keep: ...``), and a window the
    reason names ("moved at window 179612441") as its clock times, like every other window."""
    while reason.startswith(f"{outcome}:"):
        reason = reason[len(outcome) + 1:].strip()
    reason = decision_text(_WINDOW_INDEX.sub(lambda m: f"window {window_span(int(m.group(1)), window_s)}", reason))
    return f" - {reason}" if reason else ""


_WINDOW_INDEX = re.compile(r"\bwindow (\d{4,})\b")
