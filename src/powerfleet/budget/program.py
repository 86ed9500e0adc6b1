"""One deployment's budget evaluation as a pure program (the reconcile contract, docs/budget.md).

``evaluate(snapshot)`` takes everything read for one evaluation (one DGD read, one pod LIST,
the admitted record, the pending proposal, the group allowance, the scaling adapters' counts,
whether another writer was seen, the DRA claims' device classes and, when required, the agents'
enforcement reports) and returns a ``Result``: the complete desired status, the replica counts
to write, an admission record to persist, and the events to emit. It performs no I/O; ``powerfleet.budget.runner`` persists it:
replicas first (events about them only after that write changed something), then the status
once, skipped when unchanged, then the status-transition events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from powerfleet.budget.evidence import Evidence, RoleCharge, role_charge
from powerfleet.budget.ledger import role_counts
from powerfleet.budget.planner import Budget, Plan, PlanError, Reason, RoleFacts, plan
from powerfleet.cluster.dgd import DGD, ComponentType, RolloutPhase
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.immutability import AdmittedPowerInputs, admit_power_inputs, check_power_inputs_unchanged
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.power import PowerConfig, resolve_power_config
from powerfleet.cluster.settlement import SettlementState, partition_pods, settle

ROLLING = (RolloutPhase.PENDING, RolloutPhase.IN_PROGRESS, RolloutPhase.FAILED)


@dataclass(frozen=True)
class DeploymentBudget:
    power_limit_w: int
    max_gpus: int = -1
    min_gpus: int = -1
    min_replicas: Mapping[str, int] = field(default_factory=dict)  # role -> minimum (default 1)
    sole_writer: bool = False  # scale even beside another writer of the replicas


@dataclass(frozen=True)
class GroupLimit:
    group: str | None  # None: the deployment sits on no budgeted group
    limit_w: int | None  # None with a group: no allowance was computed (scale-ups are blocked)
    minimum_w: int = 0
    current_w: int = 0
    # The GPUs it can hold on its groups (budget/capacity.py); None: unknown, no ceiling
    gpu_capacity: int | None = None
    # Why an oversubscribed group it may land on admits no growth this tick (power/admission.py);
    # the limit already reflects it, the status message says it. None: admitted or not oversubscribed
    admission: str | None = None
    # It holds more than its fair share of a group (budget/groups.py ``Allowance.over_share``); a
    # limit below what it holds without it is its own proposal's shrink, not an overrun to report
    over_share: bool = False


@dataclass(frozen=True)
class Snapshot:
    dgd: DGD
    pods: Sequence[PodInfo] | None  # None: the pod LIST failed (scale-ups blocked)
    budget: DeploymentBudget
    admitted: AdmittedPowerInputs | None
    proposal: Mapping[str, int] | None  # role -> count
    group: GroupLimit | None = None
    was_rolling: bool = False
    now: str = ""  # RFC 3339, for lastTransitionTime
    adapters: Mapping[str, int] = field(default_factory=dict)  # component -> its scaling adapter's spec.replicas
    other_writer: str | None = None  # why another writer of the replicas was detected (None: none seen)
    claim_classes: Mapping[str, tuple[str, ...]] | None = None  # ResourceClaimTemplate -> device classes (DRA)
    evidence: Evidence | None = None  # the agents' enforcement reports, when they are required


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    type: str = "Normal"


@dataclass
class Result:
    status: dict[str, Any]
    replicas: dict[str, int] = field(default_factory=dict)  # component -> count to write
    admit: AdmittedPowerInputs | None = None
    status_events: list[Event] = field(default_factory=list)  # emit after the status write changed it
    scale_events: list[Event] = field(default_factory=list)  # emit after the replica write changed them
    rolling: bool = False
    warnings: list[str] = field(default_factory=list)  # log lines (the rolling hold once per stretch)
    plan: Plan | None = None


def _status(snap: Snapshot, ready: bool, reason: str, message: str, **figures: Any) -> dict[str, Any]:
    """The desired status.budget. No null values: a merge patch would read them as deletions."""
    out = {"observedGeneration": snap.dgd.generation, "ready": "True" if ready else "False", "reason": reason,
           "message": message, **figures}
    return {k: v for k, v in out.items() if v is not None}


def _finish(snap: Snapshot, previous: Mapping[str, Any], res: Result) -> Result:
    """Carry lastTransitionTime when (ready, reason) did not change; queue the transition event.
    A change of clamp or hold reasons alone is no event: it is in the status (``reasons``) and the
    ``powerfleet_budget_decisions_total`` counter; an event for it cost a call on most ticks of a
    deployment in flight (466 of 1,000 on bench/budget.py's tick after a scaling one)."""
    st = res.status
    changed = (previous.get("ready"), previous.get("reason")) != (st["ready"], st["reason"])
    st["lastTransitionTime"] = snap.now if changed or "lastTransitionTime" not in previous else previous["lastTransitionTime"]
    if changed:
        res.status_events.insert(0, Event(st["reason"], st["message"], "Normal" if st["ready"] == "True" else "Warning"))
    return res


def _facts(snap: Snapshot, admitted: AdmittedPowerInputs, by_comp: Mapping[str, list[PodInfo]] | None,
           rolling: bool) -> dict[str, RoleFacts]:
    """Each role's planner input, charged for what holds GPUs (budget/ledger.py)."""
    facts: dict[str, RoleFacts] = {}
    for role, rp in admitted.power.roles.items():
        n = role_counts(snap.dgd, rp, None if by_comp is None else by_comp.get(rp.component, []),
                        snap.adapters.get(rp.component))
        facts[role.value] = RoleFacts(
            watts_per_replica=rp.watts_per_replica, gpus_per_replica=rp.gpus_per_pod * rp.node_count,
            min_replicas=snap.budget.min_replicas.get(role.value, 1), ready=n.ready,
            proposed=(snap.proposal or {}).get(role.value), rolling=rolling, desired=n.desired, updated=n.updated,
            pods=n.pods)
    return facts


@dataclass(frozen=True)
class Rolling:
    rolling: bool
    why: list[str]
    failed: list[str]  # the Failed rollouts among ``why``, reported at once


def rolling_state(dgd: DGD, by_comp: Mapping[str, list[PodInfo]] | None, components: Sequence[str],
                  facts: Mapping[str, RoleFacts] | None = None, by_role: Mapping[str, str] | None = None) -> Rolling:
    """Rolling covers rollout phases InProgress, Pending and Failed, terminating pods, and
    replicas not yet ready or not yet updated (a Grove rollout writes no rollingUpdate phase);
    an unreadable pod list counts as rolling (scale-ups blocked for this evaluation)."""
    why: list[str] = []
    failed: list[str] = []
    phases = [("deployment", dgd.status.rollout)]
    phases += [(name, st.rollout) for name in components if (st := dgd.status.components.get(name)) is not None]
    for name, phase in phases:
        if phase in ROLLING:
            assert phase is not None
            why.append(f"{name} rollout {phase.value}")
            if phase is RolloutPhase.FAILED:
                failed.append(why[-1])
    if by_comp is None:
        why.append("pods could not be read")
    else:
        why.extend(f"{name} has terminating pods" for name in components
                   if any(p.terminating for p in by_comp.get(name, [])))
    for role, f in (facts or {}).items():
        if f.in_flight:
            name = (by_role or {}).get(role, role)
            why.append(f"{name}: {f.ready or 0} ready, {f.updated if f.updated is not None else f.ready or 0} updated "
                       f"of {f.charged} charged")
    return Rolling(bool(why), why, failed)


def _resolve(dgd: DGD, claim_classes: Mapping[str, tuple[str, ...]] | None = None) -> PowerConfig | DGDInputError:
    """The DGD's power inputs, derived once per evaluation (or the error that refuses them)."""
    try:
        return resolve_power_config(dgd, claim_classes)
    except DGDInputError as exc:
        return exc


def _admission(snap: Snapshot, previous: Mapping[str, Any]) -> tuple[AdmittedPowerInputs | None, bool, Result | None]:
    """(admitted inputs, admitted just now, or the Result that ends this evaluation early)."""
    dgd = snap.dgd
    power = _resolve(dgd, snap.claim_classes)
    if snap.admitted is not None:
        violations = check_power_inputs_unchanged(snap.admitted, dgd, resolved=power)
        if not violations:
            return snap.admitted, False, None
        msg = "power inputs changed after admission (re-admit to resume): " + "; ".join(v.line() for v in violations)
        return None, False, _finish(snap, previous, Result(_status(snap, False, "PowerInputsChanged", msg)))
    if isinstance(power, DGDInputError):
        # never invisible: the tick charges every GPU its pods hold at the maximum settable limit (budget/tenants.py)
        msg = f"{power}; its pods' GPUs are charged at the maximum settable limit on their groups"
        return None, False, _finish(snap, previous, Result(_status(snap, False, "InvalidPowerInputs", msg)))
    settlement = settle(dgd, snap.pods, power=power) if snap.pods is not None else None
    if settlement is None or settlement.state is SettlementState.PENDING:
        why = "pods could not be read" if settlement is None else "; ".join(settlement.reasons)
        msg = f"caps are admitted only from a settled deployment: {why}"
        return None, False, _finish(snap, previous, Result(_status(snap, False, "AwaitingSettlement", msg)))
    if settlement.state is SettlementState.FAILED:
        msg = "; ".join(settlement.reasons)
        return None, False, _finish(snap, previous, Result(_status(snap, False, "RolloutFailed", msg)))
    return admit_power_inputs(dgd, power=power), True, None


def _limit(snap: Snapshot, admitted: AdmittedPowerInputs) -> tuple[int, str, bool]:
    """(the power limit to plan against, a note for the message, whether scale-ups are held)."""
    own = snap.budget.power_limit_w
    g = snap.group
    if g is None or g.group is None:
        return own, "", False
    if g.limit_w is None:
        # Without a group allowance growth cannot be proven safe: hold scale-ups.
        return own, f"group {g.group}: no allowance, scale-ups blocked", True
    minimum = sum(snap.budget.min_replicas.get(r.value, 1) * rp.watts_per_replica
                  for r, rp in admitted.power.roles.items())
    closed = f"admission closed: {g.admission}" if g.admission else ""
    if g.limit_w >= minimum:
        return min(own, g.limit_w), closed, False
    # Shrink toward the minimum footprint; never grow into watts the group does not have.
    note = f"group {g.group}: allowance {g.limit_w} W is below the minimum footprint {minimum} W"
    return min(own, minimum), "; ".join(n for n in (note, closed) if n), g.current_w < minimum


def _other_writer(snap: Snapshot) -> str | None:
    """Who else writes this DGD's replicas: a Planner component, or a change seen between evaluations."""
    planners = [c.name for c in snap.dgd.components if c.type is ComponentType.PLANNER]
    if planners:
        return f"component {planners[0]!r} is a Dynamo Planner, a second writer of the replicas"
    return snap.other_writer


def rejected(snap: Snapshot, previous: Mapping[str, Any], res: Result, message: str) -> Result:
    """The replica write was refused by the server (schema, CEL rule, webhook): not a conflict to
    re-plan but an error to show, with the server's message."""
    res.status.update(ready="False", reason="ReplicaWriteRejected", message=f"replica write rejected: {message}")
    res.status_events = [e for e in res.status_events if e.reason == "PowerInputsAdmitted"]
    res.status.pop("lastTransitionTime", None)
    return _finish(snap, previous, res)


def _evidence(snap: Snapshot, admitted: AdmittedPowerInputs, by_comp: Mapping[str, list[PodInfo]] | None
              ) -> dict[str, RoleCharge]:
    """role -> its charge basis, the watts its pods cost beyond their caps, why its evidence is stale."""
    out: dict[str, RoleCharge] = {}
    for role, rp in admitted.power.roles.items():
        if by_comp is None and snap.evidence is not None and snap.evidence.mode != "off":
            out[role.value] = RoleCharge("max_settable", 0, "pods could not be read")
            continue
        out[role.value] = role_charge((by_comp or {}).get(rp.component, []), snap.evidence, rp.cap.watts,
                                      rp.gpus_per_pod)
    return out


def planning_limit(limit: int, unenforced_w: int, minimum_w: int) -> int:
    """The limit the planner sizes the replicas against: what is left once the pods' unenforced
    watts (stale GPUs at their maximum settable limit) are set aside, but never below the minimum
    footprint (roles then shrink toward their minimums: nothing lower can be planned)."""
    if not unenforced_w:
        return limit
    return max(limit - unenforced_w, min(limit, minimum_w))


def _overrun(snap: Snapshot, charged_w: int, limit: int) -> bool:
    """Over its budget: it holds more than the limit it plans against, and that is more than its own
    limit or than its fair share of a group at what it holds. A deployment whose group limit fell
    below what it holds only because it proposed fewer replicas (its share follows its demand) is
    shrinking by its own choice: no ``OverBudget`` warning, no condition change."""
    if charged_w <= limit:
        return False
    g = snap.group
    if charged_w > snap.budget.power_limit_w or g is None or g.group is None or g.limit_w is None:
        return True
    return g.over_share


def _over_budget_events(previous: Mapping[str, Any], status: Mapping[str, Any], charged_w: int, limit: int
                        ) -> list[Event]:
    """``OverBudget`` when the deployment goes over its limit, ``WithinBudget`` when it comes back:
    one event per transition, compared with the status persisted last."""
    was, now = bool(previous.get("overBudgetWatts")), bool(status.get("overBudgetWatts"))
    if now and not was:
        return [Event("OverBudget", f"holds {charged_w} W, {charged_w - limit} W above its limit of {limit} W: "
                      "nothing of it is scaled up, its proposed roles shrink", "Warning")]
    if was and not now:
        return [Event("WithinBudget", f"holds {charged_w} W, within its limit of {limit} W")]
    return []


def evaluate(snap: Snapshot, previous: Mapping[str, Any] | None = None) -> Result:
    """The whole desired outcome of one evaluation. ``previous``: the status persisted last."""
    previous = previous or {}
    dgd = snap.dgd
    admitted, admitted_now, early = _admission(snap, previous)
    if early is not None:
        return early
    assert admitted is not None
    admit_now = admitted if admitted_now else None
    by_role = {role.value: rp.component for role, rp in admitted.power.roles.items()}
    by_comp = partition_pods(dgd, snap.pods) if snap.pods is not None else None
    limit, group_note, hold_ups = _limit(snap, admitted)
    counted = _facts(snap, admitted, by_comp, False)
    roll = rolling_state(dgd, by_comp, list(by_role.values()), counted, by_role)
    charges = _evidence(snap, admitted, by_comp)
    stale = {r: c.stale for r, c in charges.items() if c.stale}
    # Each GPU is charged at its enforced limit or, without fresh evidence, its maximum settable
    # limit: what the existing pods cost beyond their caps is set aside before planning.
    unenforced = sum(c.surplus_w for c in charges.values())
    minimum = sum(f.min_replicas * f.watts_per_replica for f in counted.values())
    facts = {r: replace(f, rolling=roll.rolling or hold_ups or bool(stale)) for r, f in counted.items()}
    charged_w = sum(f.charged * f.watts_per_replica for f in counted.values()) + unenforced
    if charged_w > limit:
        # Over its share (a limit lowered, a tenant grown, the group's minimums not fitting): every
        # role shrinks, a role without a proposal too, from its desired count toward its minimum.
        facts = {r: f if f.proposed is not None else replace(f, proposed=f.desired) for r, f in facts.items()}
    if any(f.rolling or f.in_flight for f in facts.values()):
        # The planner holds scale-ups at the charge; the spec is never raised either while rolling: a
        # count raised while pods terminate makes the operator create pods beside those still holding GPUs.
        # (Only where the spec is below the charge: elsewhere the planner's hold at the charge is that.)
        facts = {r: replace(f, proposed=f.desired) if f.proposed is not None and f.desired is not None
                 and f.proposed > f.desired and f.desired < f.charged else f for r, f in facts.items()}
    try:
        capacity = snap.group.gpu_capacity if snap.group is not None else None
        result = plan(facts, Budget(planning_limit(limit, unenforced, minimum), snap.budget.max_gpus,
                                    snap.budget.min_gpus, -1 if capacity is None else capacity))
    except PlanError as exc:
        return _finish(snap, previous, Result(_status(snap, False, "Refused", str(exc)), admit=admit_now))
    res = Result(status={}, admit=admit_now, rolling=roll.rolling, plan=result)
    for role, target in result.targets.items():
        comp = dgd.component(by_role[role])
        current = snap.adapters.get(comp.name, comp.replicas) if comp is not None else None
        if target is not None and comp is not None and current != target:
            res.replicas[comp.name] = target
            res.scale_events.append(Event("Scaled", f"{comp.name} replicas {current} -> {target} ({role})"))
    writer = None if snap.budget.sole_writer else _other_writer(snap)
    if writer is not None:
        res.replicas, res.scale_events = {}, []
    if roll.rolling and result.held and not snap.was_rolling:
        res.warnings.append(f"{dgd.namespace}/{dgd.name}: scale-ups held while rolling: {'; '.join(roll.why)}")
    overrun = _overrun(snap, charged_w, limit)
    # over its share with a proposal that alone fits: the planner clamps nothing, yet it is shrinking
    over = [Reason.POWER_OVER_BUDGET_SHRINK.value] if overrun and not any(
        r.startswith("power_over_budget") for r in result.reasons) else []
    notes = [*(f"rollout failed: {w}" for w in roll.failed), *result.reasons, *over,
             *(f"enforcement_evidence_stale: {why}" for why in stale.values())]
    if group_note:
        notes.append(group_note)
    unknown = sorted(set(snap.proposal or {}) - set(facts))
    if unknown:
        notes.append(f"proposal for {', '.join(unknown)} ignored: the deployment has no such role")
    reason = "RolloutFailed" if roll.failed else "OtherWriter" if writer else "Planned"
    if writer:
        notes.insert(0, f"not scaled: {writer} (budget.deployments.<key>.sole_writer: true lets powerfleet scale it)")
    res.status = _status(
        snap, not roll.failed and not writer, reason, "; ".join(notes) or "within budget",
        powerLimitWatts=limit, ownLimitWatts=snap.budget.power_limit_w, group=snap.group.group if snap.group else None,
        settledWatts=result.settled_w + unenforced, peakWatts=result.peak_w + unenforced, gpus=result.gpus,
        peakGpus=result.peak_gpus, unenforcedWatts=unenforced or None,
        gpuCapacity=snap.group.gpu_capacity if snap.group is not None else None,
        # targets: the counts to reach; a component absent from it is left as is (no proposal, or held)
        targets={by_role[r]: t for r, t in result.targets.items() if t is not None},
        held=sorted(by_role[r] for r in result.held),
        reasons=[*result.reasons, *over, *(["enforcement_evidence_stale"] if stale else [])], rolling=roll.rolling,
        # what each role's watts are charged at: requested_cap (no agent reports from its nodes, or
        # evidence off), enforced (fresh reports for its pods) or max_settable (stale: budget/evidence.py)
        chargeBasis={by_role[r]: c.basis for r, c in charges.items()})
    # Over its share: what it holds now (the ledger) is above the limit it plans against. Reported
    # in the status, by a transition event (once each way) and by a gauge (budget/metrics.py).
    if overrun:
        res.status["overBudgetWatts"] = charged_w - limit
    res.status_events.extend(_over_budget_events(previous, res.status, charged_w, limit))
    if admit_now is not None:
        res.status_events.append(Event("PowerInputsAdmitted", "caps admitted from a settled deployment: " + ", ".join(
            f"{rp.component}={rp.cap.raw.strip()}W/GPU" for rp in admitted.power.roles.values())))
    return _finish(snap, previous, res)
