"""A closed loop of the project's own guard and agent code over simulated GPUs, on one injected clock.

Each second: every live agent resolves each GPU's limit with its ``OverlayStore`` (agent/throttle.py,
the code the pass calls), the GPU draws ``min(demand, limit)`` (draw never exceeds the limit in
force), the agent publishes its evidence record (agent/evidence.py's ``enforcement_record``) with
the draw its sensor reads, the guard reads it through the real parser (power/telemetry.py) and runs
one period (power/live.py), and its overlays reach the live agents. A dead agent publishes nothing
(its last hash lingers, as its TTL lets it) and leaves NVML at the limit it last set. Sensor faults
change only what is reported: ``unreadable`` (no draw), ``zero`` (0 W), ``stuck`` (the value it read
when the fault began).

``slipping`` runs it with the guard's periods skipped and its messages late (scheduling slip under CPU
load). ``FaultyGroup`` is the hypothesis state machine over it (tests/power/test_sensor_faults.py runs it
bounded, bench/power_faults.py longer).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from powerfleet.agent.evidence import enforcement_record
from powerfleet.agent.report import GpuOutcome
from powerfleet.agent.throttle import OverlayStore
from powerfleet.clock import FakeClock
from powerfleet.power.guard import GuardSettings
from powerfleet.power.live import GroupView, GuardMemory, GuardPeriod, guard_period
from powerfleet.power.overlay import Overlay
from powerfleet.power.safe import GpuRange, safe_caps
from powerfleet.power.telemetry import GpuTelemetry, parse_telemetry

ANNOTATION_W, MIN_W, MAX_W = 700.0, 200.0, 700.0
GROUP = "rack-a"


@dataclass
class SimGpu:
    uuid: str
    node: str
    pod: str
    demand_w: float = 300.0
    limit_w: float = MAX_W  # what NVML enforces
    fault: str | None = None  # unreadable | zero | stuck
    stuck_w: float = 0.0
    last_draw_w: float = 0.0

    def draw(self) -> float:
        return min(self.demand_w, self.limit_w)

    def reading(self) -> float | None:
        if self.fault == "unreadable":
            return None
        if self.fault == "zero":
            return 0.0
        if self.fault == "stuck":
            return self.stuck_w
        return self.draw()


@dataclass
class SimAgent:
    node: str
    store: OverlayStore
    alive: bool = True


@dataclass
class Loop:
    limit_w: float
    gpus: list[SimGpu]
    clock: FakeClock = field(default_factory=lambda: FakeClock(t=1000.0, mono=50.0))
    settings: GuardSettings = field(default_factory=lambda: GuardSettings(period_s=1.0))
    low: frozenset[str] = frozenset()  # pods at low priority
    state_dir: Path | None = None
    guard_up: bool = True
    memory: GuardMemory = field(default_factory=GuardMemory)
    period: GuardPeriod | None = None
    hashes: dict[str, list[GpuTelemetry]] = field(default_factory=dict)
    agents: dict[str, SimAgent] = field(default_factory=dict)
    history: list[tuple[float, float]] = field(default_factory=list)  # (time, true group draw)
    # Scheduling slip: overlays reach the agents this many seconds after the guard sent them (a
    # loaded worker, broker or agent), and one older than its ``expires`` on arrival is dropped, as
    # Celery drops it; ``guard_up`` False for a second is a guard period that did not run.
    delay_s: int = 0
    in_flight: list[tuple[float, str, Overlay]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for node in sorted({g.node for g in self.gpus}):
            self.agents[node] = SimAgent(node, self._store(node))

    def _store(self, node: str) -> OverlayStore:
        path = None if self.state_dir is None else self.state_dir / node / "overlays.json"
        return OverlayStore(self.clock, path=path, groups={GROUP})

    @classmethod
    def of(cls, nodes: int, per_node: int, ratio: float, **kw: object) -> Loop:
        gpus = [SimGpu(f"GPU-{n}-{i}", f"node-{n}", f"pod-{n}-{i}") for n in range(nodes) for i in range(per_node)]
        return cls(limit_w=ANNOTATION_W * len(gpus) / ratio, gpus=gpus, **kw)  # type: ignore[arg-type]

    def node(self, n: int) -> list[SimGpu]:
        return [g for g in self.gpus if g.node == f"node-{n}"]

    def kill(self, node: str) -> None:
        self.agents[node].alive = False

    def restart(self, node: str) -> None:
        """A new agent process: a new store, from what its state directory holds."""
        self.agents[node] = SimAgent(node, self._store(node))

    def fault(self, gpus: list[SimGpu], kind: str | None) -> None:
        for g in gpus:
            g.fault, g.stuck_w = kind, g.last_draw_w

    def true_draw(self) -> float:
        return math.fsum(g.draw() for g in self.gpus)

    def step(self) -> None:
        """One second of the loop."""
        self.clock.advance(1.0)
        now = self.clock.now()
        self._deliver(now)
        for g in self.gpus:
            a = self.agents[g.node]
            if a.alive:
                g.limit_w = a.store.limit_mw(g.uuid, int(ANNOTATION_W * 1000), int(MIN_W * 1000),
                                             int(MAX_W * 1000))[0] / 1000
        for g in self.gpus:
            g.last_draw_w = g.draw()
        self.history.append((now, self.true_draw()))
        for node, a in self.agents.items():
            if a.alive:
                # what RedisTelemetry.read hands the guard: the parsed fields, a field it cannot use left out
                self.hashes[node] = [t for g in self.gpus if g.node == node and (t := self._report(g, now)) is not None]
        if not self.guard_up:
            return
        view = GroupView(nodes=frozenset(self.agents), priority={g.pod: ("low" if g.pod in self.low else "high")
                                                                 for g in self.gpus},
                         gpus={n: sum(1 for g in self.gpus if g.node == n) for n in self.agents})
        self.period = guard_period(self.settings, GROUP, self.limit_w, view, self.hashes, self.memory, now)
        self.memory = self.period.memory
        for node, overlay in self.period.overlays.items():
            self.in_flight.append((now + self.delay_s, node, overlay))
        self._deliver(now)

    def _deliver(self, now: float) -> None:
        due = [m for m in self.in_flight if m[0] <= now]
        self.in_flight = [m for m in self.in_flight if m[0] > now]
        for _, node, overlay in due:
            if self.agents[node].alive and now - overlay.issued_at <= overlay.ttl_s():
                self.agents[node].store.receive(overlay)

    def _report(self, g: SimGpu, now: float) -> GpuTelemetry | None:
        out = GpuOutcome(index=0, uuid=g.uuid, pods=[g.pod], decision="single", requested_w=ANNOTATION_W,
                         cap_w=g.limit_w, current_w=g.limit_w, draw_w=g.reading(), action="set", min_w=MIN_W,
                         max_w=MAX_W, enforced_w=g.limit_w, write="ok", readback="match")
        return parse_telemetry(g.node, g.uuid, json.dumps(enforcement_record(g.node, out, now, {})))

    def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.step()

    def over(self, since: float) -> list[tuple[float, float]]:
        """The seconds from ``since`` on in which the group drew above its limit: (time, W over; NVML takes
        whole milliwatts, so the safe caps may add up to a few mW above the limit)."""
        return [(t, round(w - self.limit_w, 1)) for t, w in self.history if t >= since and w > self.limit_w + 0.01]  # mW rounding


def longest_run(over: list[tuple[float, float]]) -> int:
    """The longest run of consecutive seconds in ``Loop.over``'s list."""
    best = run = 0
    last = None
    for t, _ in over:
        run = run + 1 if last is not None and t - last == 1 else 1
        best, last = max(best, run), t
    return best


def slipping(seed: int, skip: float, delay_s: int, seconds: int = 100) -> list[tuple[float, float]]:
    """``seconds`` of random demand on 8 x 700 W at 1.3x (cap ceiling off) after a light start; a share
    ``skip`` of the guard's periods do not run and every overlay reaches its agent ``delay_s`` late.
    Returns the seconds over the limit (tests/power/test_guard_timing.py, bench/power_slip.py)."""
    rnd = random.Random(seed)
    loop = Loop.of(2, 4, ratio=1.3, settings=GuardSettings(period_s=1.0, cap_ceiling=None), delay_s=delay_s)
    for g in loop.gpus:
        g.demand_w = 100.0
    loop.run(10)
    t0 = loop.clock.now()
    for _ in range(seconds):
        for g in loop.gpus:
            g.demand_w = rnd.choice([100.0, 300.0, 700.0, 700.0])
        loop.guard_up = rnd.random() > skip
        loop.step()
    return loop.over(t0)


class FaultyGroup(RuleBasedStateMachine):
    """Random groups, random sensor faults, agents that die and restart; the guard's figure is never below
    what the GPUs draw once each fault has lasted its detection time (unreadable and zero: the next period;
    dead: two periods; stuck: the plausibility window, the group's load moving every second)."""

    @initialize(nodes=st.integers(1, 3), per_node=st.integers(1, 4), ratio=st.floats(1.05, 1.6),
                demands=st.lists(st.sampled_from([40.0, 150.0, 300.0, 500.0, 700.0]), min_size=12, max_size=12))
    def setup(self, nodes: int, per_node: int, ratio: float, demands: list[float]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="powerfleet-loop-"))
        self.loop = Loop.of(nodes, per_node, ratio, state_dir=self.dir)
        mover = Loop.of(1, 1, 1.0).gpus[0]  # an honest GPU on a node of its own whose load always moves
        mover.uuid, mover.node, mover.pod = "GPU-m", "node-m", "pod-m"
        self.loop.gpus.append(mover)
        self.loop.limit_w = ANNOTATION_W * len(self.loop.gpus) / ratio
        self.loop.agents.clear()
        self.loop.__post_init__()
        self.mover = mover
        for g, d in zip(self.loop.gpus, demands):
            g.demand_w = d
        self.since: dict[str, tuple[str, float]] = {}  # GPU or node -> (fault, since)

    def teardown(self) -> None:
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    def _faultable(self) -> list:  # type: ignore[type-arg]
        return [g for g in self.loop.gpus if g is not self.mover]

    @rule(demands=st.lists(st.sampled_from([40.0, 150.0, 300.0, 500.0, 700.0]), min_size=12, max_size=12))
    def second(self, demands: list[float]) -> None:
        for g, d in zip(self._faultable(), demands):
            g.demand_w = d
        self.mover.demand_w = MIN_W if self.mover.demand_w == ANNOTATION_W else ANNOTATION_W
        self.loop.step()

    @rule(i=st.integers(0, 11), kind=st.sampled_from(["unreadable", "zero", "stuck", None]))
    def sensor(self, i: int, kind: str | None) -> None:
        gpus = self._faultable()
        g = gpus[i % len(gpus)]
        if g.fault == kind:
            return
        self.loop.fault([g], kind)
        # a sensor that reads again is believed from the next period on
        self.since[g.uuid] = (kind or "restarted", self.loop.clock.now())

    @rule(n=st.integers(0, 2))
    def kill(self, n: int) -> None:
        node = f"node-{n}"
        if node in self.loop.agents and self.loop.agents[node].alive:
            self.loop.kill(node)
            self.since[node] = ("dead", self.loop.clock.now())

    @rule(n=st.integers(0, 2))
    def restart(self, n: int) -> None:
        node = f"node-{n}"
        if node in self.loop.agents and not self.loop.agents[node].alive:
            self.loop.restart(node)
            now = self.loop.clock.now()
            self.since[node] = ("restarted", now)  # its first report comes with the next second
            for g in self.loop.gpus:  # a stuck reading is judged from when the guard sees readings again
                if g.node == node and g.fault == "stuck":
                    self.since[g.uuid] = ("stuck", now)

    def _settled(self) -> bool:
        s = self.loop.settings
        need = {"unreadable": s.period_s, "zero": s.period_s, "restarted": s.period_s,
                "stuck": s.stuck_s + 2 * s.period_s,
                "dead": (s.stale_periods + 1) * s.period_s}
        now = self.loop.clock.now()
        return all(now - t >= need[kind] for kind, t in self.since.values())

    @invariant()
    def the_guard_never_counts_less_than_is_drawn(self) -> None:
        p = self.loop.period
        if p is None or p.decision is None or not self._settled():
            return
        assert p.decision.measured_w >= self.loop.true_draw() - 1e-6, (
            p.decision.measured_w, self.loop.true_draw(), p.faults, self.since,
            [(g.uuid, g.fault, g.draw(), g.limit_w) for g in self.loop.gpus])

    @invariant()
    def the_safe_caps_fit_the_limit(self) -> None:
        p = self.loop.period
        if p is not None and p.decision is not None:
            assert sum(p.decision.safe.values()) <= self.loop.limit_w + 1e-6
            ranges = {g: GpuRange(ANNOTATION_W, MIN_W, MAX_W) for g in p.decision.safe}
            assert p.decision.safe == safe_caps(ranges, self.loop.limit_w)  # every known GPU has its share
