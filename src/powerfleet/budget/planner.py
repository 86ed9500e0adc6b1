"""The pure budget planner: replica targets clamped to a GPU budget and a power budget.

Order (docs/budget.md): GPU clamp (ceiling, then the optional floor), rollout hold, power
clamp, staging of opposing rebalances, a final refill. Where the GPU floor and the power
ceiling conflict the power ceiling wins and the floor violation is reported.

Vocabulary: ``ready`` is the role's ready count (missing = baseline 0), ``desired`` its spec
count, ``updated`` its count at the current revision, ``pods`` the replicas its existing pods
make up (surge and Terminating pods included), ``proposed`` the count someone asked for (None =
no opinion). A role is *charged* at the largest of ready, desired, updated and pods: what
physically holds GPUs now or will once in-flight replicas start. A role with replicas not yet
ready or not yet updated counts as rolling. A role without a proposal keeps its count, is
charged at its charge and answers None. A held scale-up answers None too ("leave as is"), so a
hold never patches an in-flight rollout's desired count down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from powerfleet.budget.fit import fit, weighted


class PlanError(ValueError):
    """The input cannot be planned (bad numbers, or the minimum footprint does not fit)."""


class Reason(StrEnum):
    PROPOSAL_BELOW_MINIMUM = "proposal_raised_to_minimum"
    GPU_BUDGET_CLAMPED = "gpu_budget_clamped"
    GPU_SCALE_UP_SUPPRESSED = "gpu_budget_scale_up_suppressed"
    GPU_FLOOR_RAISED = "gpu_floor_raised"
    GPU_FLOOR_VIOLATED = "gpu_floor_violated"
    ROLLOUT_HOLD = "rollout_scale_up_held"
    POWER_CLAMPED = "power_budget_clamped"
    POWER_OVER_BUDGET_SHRINK = "power_over_budget_shrink"
    POWER_SCALE_UP_SUPPRESSED = "power_budget_scale_up_suppressed"
    POWER_STAGED = "power_rebalance_staged"
    GPU_STAGED = "gpu_rebalance_staged"
    OVER_BUDGET_UNREMEDIED = "power_over_budget_unremedied"
    GPU_CAPACITY = "gpu_capacity"


def charged_count(ready: int | None, desired: int | None, updated: int | None, pods: int | None) -> int:
    """The replicas a role is charged for: the largest of its ready, desired (spec) and updated
    counts and the replicas its existing pods make up (None: the ready count; ready None: 0)."""
    base = ready or 0
    return max(base, base if desired is None else desired, base if updated is None else updated, pods or 0)


@dataclass(frozen=True)
class RoleFacts:
    watts_per_replica: int
    gpus_per_replica: int
    min_replicas: int = 1
    ready: int | None = None
    proposed: int | None = None
    rolling: bool = False
    desired: int | None = None  # spec replicas (None: the ready count)
    updated: int | None = None  # replicas at the current revision (None: the ready count)
    pods: int | None = None  # replicas the role's existing pods make up, surge and Terminating included

    @property
    def charged(self) -> int:
        """What the role holds or is about to hold: max(ready, desired, updated, pods)."""
        return charged_count(self.ready, self.desired, self.updated, self.pods)

    @property
    def in_flight(self) -> bool:
        """Replicas not yet ready or not yet updated: counts as rolling (scale-ups held)."""
        charged = self.charged
        return (self.ready or 0) < charged or (self.updated is not None and self.updated < charged)


@dataclass(frozen=True)
class Budget:
    power_limit_w: int
    max_gpus: int = -1  # negative: no GPU ceiling
    min_gpus: int = -1  # negative: no GPU floor
    # The GPUs the deployment can hold where its replicas may land (what its pods hold there plus
    # the free GPUs it may take); negative: unknown, no ceiling. It only stops growth, never shrinks.
    capacity_gpus: int = -1


@dataclass(frozen=True)
class Plan:
    targets: dict[str, int | None]  # None: leave as is
    reasons: tuple[str, ...]
    settled_w: int  # projected watts once the targets are reached
    peak_w: int  # projected watts during the transition: per role max(current, target)
    gpus: int
    held: frozenset[str] = field(default_factory=frozenset)  # roles whose scale-up was held
    staged_goal: dict[str, int] | None = None  # a staged rebalance's clamped goal (reached over evaluations)
    peak_gpus: int = 0  # GPUs held during the transition: per role max(current, target)

    def to_json(self) -> dict[str, object]:
        return {"targets": self.targets, "reasons": list(self.reasons), "settled_w": self.settled_w,
                "peak_w": self.peak_w, "gpus": self.gpus, "peak_gpus": self.peak_gpus}


def _validate(roles: Mapping[str, RoleFacts], budget: Budget) -> None:
    if not roles:
        raise PlanError("roles: at least one role is required")
    if budget.power_limit_w < 0:
        raise PlanError(f"budget.power_limit_w: {budget.power_limit_w} is negative")
    for name, f in roles.items():
        for what, v in (("watts_per_replica", f.watts_per_replica), ("gpus_per_replica", f.gpus_per_replica),
                        ("min_replicas", f.min_replicas), ("ready", f.ready), ("proposed", f.proposed),
                        ("desired", f.desired), ("updated", f.updated), ("pods", f.pods)):
            if v is not None and v < 0:
                raise PlanError(f"roles.{name}.{what}: {v} is negative")
    if 0 <= budget.max_gpus < budget.min_gpus:
        raise PlanError(f"budget.min_gpus: {budget.min_gpus} is above budget.max_gpus ({budget.max_gpus})")
    min_w = sum(f.min_replicas * f.watts_per_replica for f in roles.values())
    if min_w > budget.power_limit_w:
        raise PlanError(f"the minimum footprint ({min_w} W) exceeds the power limit ({budget.power_limit_w} W)")
    min_g = sum(f.min_replicas * f.gpus_per_replica for f in roles.values())
    if 0 <= budget.max_gpus < min_g:
        raise PlanError(f"the minimum footprint ({min_g} GPUs) exceeds the GPU ceiling ({budget.max_gpus})")


class _State:
    """The working targets of one plan: proposed roles move, the others stay at ready."""

    def __init__(self, roles: Mapping[str, RoleFacts]) -> None:
        self.roles = roles
        self.cur = {r: f.charged for r, f in roles.items()}
        self.proposed = [r for r, f in roles.items() if f.proposed is not None]
        self.t = {r: self.cur[r] for r in roles}
        self.reasons: list[str] = []
        self.held: set[str] = set()
        self.staged: dict[str, int] | None = None
        self.capacity: int | None = None  # the GPU capacity ceiling in force (None: none)
        for r in self.proposed:
            p = roles[r].proposed
            assert p is not None
            self.t[r] = max(p, roles[r].min_replicas)
            if p < roles[r].min_replicas:
                self.note(Reason.PROPOSAL_BELOW_MINIMUM)

    def note(self, reason: Reason) -> None:
        if reason.value not in self.reasons:
            self.reasons.append(reason.value)

    def cost(self, attr: str) -> dict[str, int]:
        return {r: getattr(f, attr) for r, f in self.roles.items()}

    def clamp(self, attr: str, limit: int, clamped: Reason, shrink: Reason, suppressed: Reason) -> None:
        """Lower proposed roles so sum(target * attr) <= limit; never below minimum, never up."""
        cost = self.cost(attr)
        if weighted(self.t, cost) <= limit or not self.proposed:
            return
        fixed = sum(self.cur[r] * cost[r] for r in self.roles if r not in self.proposed)
        current_fits = weighted(self.cur, cost) <= limit
        upper = {r: self.t[r] for r in self.proposed}
        # When the current state fits, a clamp keeps each role between its current count and its
        # proposal (it never turns a requested scale-up into a scale-down); else shrink to minimum.
        # (An earlier hold may have left a role below its minimum: the bound never exceeds upper.)
        lower: dict[str, int] = {}
        for r in self.proposed:
            floor = self.roles[r].min_replicas
            lower[r] = min(upper[r], max(floor, self.cur[r]) if current_fits else floor)
        got = fit(upper, lower, {r: cost[r] for r in self.proposed}, limit - fixed)
        if got is None:
            # Peers charged at their ready counts already exhaust the budget: hold, never grow.
            for r in self.proposed:
                self.t[r] = min(self.t[r], self.cur[r])
                self.held.add(r)
            self.note(suppressed)
            return
        self.t.update(got)
        self.note(clamped if current_fits else shrink)

    def usage(self, attr: str) -> tuple[int, int]:
        """(settled, transition peak) of ``attr`` (watts or GPUs); the peak is per role max(current, target)."""
        c = self.cost(attr)
        return weighted(self.t, c), sum(max(self.cur[r], self.t[r]) * c[r] for r in self.roles)

    def watts(self) -> tuple[int, int]:
        return self.usage("watts_per_replica")

    def gpu_limit(self, budget: Budget) -> int | None:
        """The tighter of the configured GPU ceiling and the capacity ceiling (None: neither)."""
        limits = [x for x in (budget.max_gpus if budget.max_gpus >= 0 else None, self.capacity) if x is not None]
        return min(limits) if limits else None

    def settled_fits(self, budget: Budget) -> bool:
        """The targets' settled watts and GPUs within every ceiling."""
        gpus = self.gpu_limit(budget)
        return (self.watts()[0] <= budget.power_limit_w
                and (gpus is None or self.usage("gpus_per_replica")[0] <= gpus))


def _capacity(s: _State, budget: Budget) -> None:
    """Scale-ups only into the GPUs that exist: the targets' GPUs fit the capacity, or, where what
    is charged (or proposed down) already exceeds it (replicas not placed yet), growth stops there.
    Never a shrink: a proposed role keeps at least min(target, current), no role below its minimum."""
    if budget.capacity_gpus < 0 or not s.proposed:
        return
    g = s.cost("gpus_per_replica")
    fixed = sum(s.cur[r] * g[r] for r in s.roles if r not in s.proposed)
    upper = {r: s.t[r] for r in s.proposed}
    lower = {r: min(upper[r], max(s.roles[r].min_replicas, s.cur[r])) for r in s.proposed}
    s.capacity = max(budget.capacity_gpus, fixed + weighted(lower, g))
    if fixed + weighted(upper, g) <= s.capacity:
        return
    got = fit(upper, lower, {r: g[r] for r in s.proposed}, s.capacity - fixed)
    assert got is not None  # the capacity in force is at least what ``lower`` holds
    s.t.update(got)
    s.held.update(r for r in s.proposed if got[r] <= s.cur[r] < upper[r])
    s.note(Reason.GPU_CAPACITY)


def _gpu_floor(s: _State, budget: Budget) -> None:
    g = s.cost("gpus_per_replica")
    candidates = [r for r in s.proposed if g[r] > 0 and r not in s.held]
    raised = False
    while weighted(s.t, g) < budget.min_gpus and candidates:
        r = min(candidates, key=lambda x: (s.t[x] * g[x], candidates.index(x)))
        if 0 <= budget.max_gpus < weighted(s.t, g) + g[r]:
            candidates.remove(r)
            continue
        s.t[r] += 1
        raised = True
    if raised:
        s.note(Reason.GPU_FLOOR_RAISED)


def _stage(s: _State, budget: Budget) -> None:
    """An opposing rebalance whose transition peak (watts, or GPUs against the ceiling) does not
    fit: scale-downs now, scale-ups next time."""
    ups = [r for r in s.proposed if s.t[r] > s.cur[r]]
    downs = [r for r in s.proposed if s.t[r] < s.cur[r]]
    if not (ups and downs):
        return
    power_over = s.watts()[1] > budget.power_limit_w
    gpu_limit = s.gpu_limit(budget)
    gpus_over = gpu_limit is not None and s.usage("gpus_per_replica")[1] > gpu_limit
    if power_over or gpus_over:
        s.staged = dict(s.t)
        for r in ups:
            s.t[r] = s.cur[r]
            s.held.add(r)
        s.note(Reason.POWER_STAGED if power_over else Reason.GPU_STAGED)


def _final_refill(s: _State, budget: Budget, upper: Mapping[str, int], rolling: bool) -> None:
    """Hand back every replica that still fits both ceilings once settled (e.g. the power clamp
    lowered a peer below what the GPU clamp assumed): one replica at a time to the role furthest
    below its proposal, until none fits, so afterwards no proposed role could take one more. A
    transition peak this creates is staged afterwards (``_stage``)."""
    while True:
        best: str | None = None
        best_key: tuple[float, int] | None = None
        for i, r in enumerate(s.proposed):
            if r in s.held or s.t[r] >= upper[r] or (rolling and s.t[r] + 1 > s.cur[r]):
                continue
            s.t[r] += 1
            ok = s.settled_fits(budget)
            s.t[r] -= 1
            key = (s.t[r] / upper[r], i)
            if ok and (best_key is None or key < best_key):
                best, best_key = r, key
        if best is None:
            return
        s.t[best] += 1


def plan(roles: Mapping[str, RoleFacts], budget: Budget) -> Plan:
    """Targets for ``roles`` under ``budget``. Raises PlanError when it cannot be planned."""
    _validate(roles, budget)
    s = _State(roles)
    upper = {r: s.t[r] for r in s.proposed}  # the proposals (raised to minimums): the refill's ceiling
    if budget.max_gpus >= 0:
        s.clamp("gpus_per_replica", budget.max_gpus, Reason.GPU_BUDGET_CLAMPED, Reason.GPU_BUDGET_CLAMPED,
                Reason.GPU_SCALE_UP_SUPPRESSED)
    if budget.min_gpus >= 0:
        _gpu_floor(s, budget)
        upper = {r: max(upper[r], s.t[r]) for r in s.proposed}
    _capacity(s, budget)
    rolling = any(f.rolling or f.in_flight for f in roles.values())
    if rolling:
        for r in s.proposed:
            if s.t[r] > s.cur[r]:
                s.t[r] = s.cur[r]
                s.held.add(r)
                s.note(Reason.ROLLOUT_HOLD)
    s.clamp("watts_per_replica", budget.power_limit_w, Reason.POWER_CLAMPED, Reason.POWER_OVER_BUDGET_SHRINK,
            Reason.POWER_SCALE_UP_SUPPRESSED)
    _final_refill(s, budget, upper, rolling)
    _stage(s, budget)
    settled, peak = s.watts()
    if settled > budget.power_limit_w:
        s.note(Reason.OVER_BUDGET_UNREMEDIED)
    gpus, peak_gpus = s.usage("gpus_per_replica")
    if 0 <= budget.min_gpus and gpus < budget.min_gpus:
        s.note(Reason.GPU_FLOOR_VIOLATED)
    targets: dict[str, int | None] = {}
    for r, f in roles.items():
        t = s.t[r]
        unproposed = f.proposed is None
        held = r in s.held and t >= s.cur[r]
        empty_hold = f.ready is None and t == 0 == s.cur[r]  # a hold at a missing baseline never patches 0
        targets[r] = None if unproposed or held or empty_hold else t
    held_roles = frozenset(r for r in s.held if targets[r] is None)
    return Plan(targets=targets, reasons=tuple(s.reasons), settled_w=settled, peak_w=peak, gpus=gpus, held=held_roles,
                staged_goal=s.staged, peak_gpus=peak_gpus)
