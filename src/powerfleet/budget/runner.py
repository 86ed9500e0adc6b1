"""The I/O around the pure budget program: read once, evaluate, persist by the reconcile contract.

``evaluate_deployment``: one DGD GET feeds the drift check and the plan; one pod LIST; the
replicas are written first (a merge/JSON patch of the counts only, fenced on the version read)
and their events emitted only after that write changed something; then the status is written
once where it lives (budget/persist.py: a ConfigMap per deployment, or ``status.budget``),
skipped when unchanged, and its transition events emitted only after that write. The tick's half (``tick_limits``) is budget/tick.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import redis

from powerfleet.budget.evidence import Evidence, EvidenceSource
from powerfleet.budget.persist import DgdStatus, StatusSink
from powerfleet.budget.program import DeploymentBudget, Event, GroupLimit, Result, Snapshot, evaluate, rejected
from powerfleet.budget.scale import (NoAdapters, Owners, PartialWrite, ScalingPort, other_writer, owned_counts,
                                    owners_of, write_replicas)
from powerfleet.budget.state import BudgetState
from powerfleet.budget.tick import TickPlan, budget_of, tick_limits  # noqa: F401 - the tick's half, re-exported
from powerfleet.clock import Clock
from powerfleet.cluster.dgd import DGD, DGD_KIND, parse_dgd
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.objects import ObjectRef
from powerfleet.cluster.patch_errors import Rejected
from powerfleet.cluster.ports import ClusterError, ClusterWriter, Conflict, NotFound

log = logging.getLogger("powerfleet.budget")
TRANSIENT_STATUSES = {429, 500, 502, 503, 504}


class TransientClusterError(ClusterError):
    """A write failed for a reason worth retrying (transport error, 429, 5xx)."""


def is_transient(exc: ClusterError) -> bool:
    return not isinstance(exc, (Conflict, NotFound)) and (exc.status is None or exc.status in TRANSIENT_STATUSES)


@dataclass
class Outcome:
    deployment: str
    reason: str
    ready: bool = False
    targets: dict[str, int | None] = field(default_factory=dict)
    settled_w: int | None = None
    peak_w: int | None = None
    gpus: int | None = None
    limit_w: int | None = None
    reasons: list[str] = field(default_factory=list)
    over_w: int | None = None  # watts held above the limit (0: within; None: not planned)
    replicas_written: dict[str, int] = field(default_factory=dict)
    status_written: bool = False
    events: list[str] = field(default_factory=list)
    skipped: str | None = None  # why nothing was written: its tick's allowance was outdated by then


Fence = Callable[[], "str | None"]  # why the allowance may no longer be applied (None: it may)


class _Emitter:
    def __init__(self, cluster: ClusterWriter, dgd: DGD, out: Outcome) -> None:
        self.cluster, self.out = cluster, out
        self.ref = ObjectRef(kind=DGD_KIND, name=dgd.name, namespace=dgd.namespace, api_version=dgd.api_version,
                             uid=dgd.uid)

    def emit(self, events: list[Event]) -> None:
        for ev in events:
            try:
                self.cluster.record_event(self.ref, ev.reason, ev.message, type="Warning" if ev.type == "Warning" else "Normal")
                self.out.events.append(ev.reason)
            except ClusterError as exc:  # an event is best effort; the state it describes is written
                log.warning("%s: event %s not recorded: %s", self.out.deployment, ev.reason, exc)


def _write(cluster: ClusterWriter, sink: StatusSink, obj: Mapping[str, Any], snap: Snapshot, res: Result,
           previous: Mapping[str, Any], out: Outcome, scaling: ScalingPort, owners: Owners,
           fence: Fence | None = None) -> Result:
    dgd = snap.dgd
    emitter = _Emitter(cluster, dgd, out)
    if fence is not None and (why := fence()) is not None:  # a later tick re-divided the budget meanwhile
        out.reason, out.ready, out.skipped = "Outdated", False, why
        return res
    if res.replicas:
        try:
            try:
                changed, version = write_replicas(cluster, scaling, dgd, owners, res.replicas)
            except PartialWrite as partial:  # what landed is powerfleet's own (budget/scale.py)
                out.replicas_written = partial.written
                raise partial.cause from partial
        except Conflict:
            # Someone changed the object since it was read: nothing written; the next evaluation re-plans.
            res.status["message"] = f"{res.status['message']}; replica write conflicted, re-planned next evaluation"
        except Rejected as exc:
            # Refused by the server (schema, CEL rule, webhook): an error to show, not a conflict to retry.
            res = rejected(snap, previous, res, str(exc))
            out.reason, out.ready = res.status["reason"], False
        except ClusterError as exc:
            if is_transient(exc):
                raise TransientClusterError(str(exc), status=exc.status) from exc
            raise
        else:
            out.replicas_written = changed
            if changed:
                # A scale's record is its status (two API calls per scale: replicas, status), not an
                # Event: events expire within the hour, and an event per scale was a third call each.
                res.status["lastScale"] = {"at": snap.now, "changes": [
                    ev.message for ev in res.scale_events if ev.message.split(" ", 1)[0] in changed]}
            if version:  # the condition's patch is fenced on the DGD as powerfleet left it
                obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "resourceVersion": version}}
                # and the status describes it so: the write changed the spec, so the server moved its
                # generation on by one; a status naming the one read would be written again next time
                if type(res.status.get("observedGeneration")) is int:
                    res.status["observedGeneration"] += 1
    if "lastScale" in previous and "lastScale" not in res.status:
        res.status["lastScale"] = previous["lastScale"]  # the last scale stays on record until the next
    if dict(previous) != res.status:
        try:
            sink.write(obj, res.status)
        except Conflict as exc:
            # As for replicas: nothing written, no status event; the next evaluation computes it again.
            log.warning("%s/%s: status write conflicted, written at the next evaluation: %s",
                        dgd.namespace, dgd.name, exc)
            return res
        except ClusterError as exc:
            if is_transient(exc):
                raise TransientClusterError(str(exc), status=exc.status) from exc
            raise
        out.status_written = True
        emitter.emit(res.status_events)  # its transitions: Ready, OverBudget, WithinBudget, inputs
    sink.report(obj, res.status)
    return res





class ClaimTemplates(Protocol):
    def list_claim_templates(self, namespace: str) -> dict[str, tuple[str, ...]]: ...


def claim_classes_of(dra: ClaimTemplates | None, dgd: DGD) -> dict[str, tuple[str, ...]] | None:
    """The namespace's ResourceClaimTemplates, read only for a DGD whose components claim DRA devices
    (None: not read, or unreadable; a claim then counts as one that may allocate GPUs)."""
    if dra is None or not any(c.gpu_claims for c in dgd.components):
        return None
    try:
        return dra.list_claim_templates(dgd.namespace)
    except ClusterError as exc:
        log.warning("%s/%s: ResourceClaimTemplates unreadable: %s", dgd.namespace, dgd.name, exc)
        return None


def _read_evidence(source: EvidenceSource | None, pods: list[Any] | None, clock: Clock, key: str) -> Evidence | None:
    if source is None:
        return None
    try:
        return source.read((p.node_name for p in pods or [] if p.node_name), clock.now())
    except redis.RedisError as exc:  # no evidence at all: every GPU is charged as unenforced
        log.warning("%s: enforcement reports unreadable: %s", key, exc)
        return source.unreadable(clock.now())


def evaluate_deployment(cluster: ClusterWriter, state: BudgetState, key: str, budget: DeploymentBudget,
                        group: GroupLimit | None, clock: Clock, sink: StatusSink | None = None,
                        scaling: ScalingPort | None = None, dra: ClaimTemplates | None = None,
                        evidence: EvidenceSource | None = None, *, fence: Fence | None = None) -> Outcome:
    """One evaluation of ``key`` ("namespace/name"). ``sink``: where the status is persisted
    (budget/persist.py; the task passes the configured one, default ``status.budget`` on the DGD).
    ``scaling``: the scaling adapters (budget/scale.py; default: none are looked for). ``dra``:
    the ResourceClaimTemplates a DRA claim's device class is looked up in (default: not looked up).
    ``evidence``: where the agents' enforcement reports are read (default: none, the requested caps).
    ``fence``: asked just before anything is written whether ``group`` may still be applied (the
    tick's generation, budget/generations.py); when it may not, nothing is written (``skipped``)."""
    sink = sink if sink is not None else DgdStatus(cluster)
    scaling = scaling if scaling is not None else NoAdapters()
    namespace, _, name = key.partition("/")
    try:
        obj = cluster.get_dgd_object(namespace, name)
    except NotFound:
        return Outcome(key, "NotFound")
    except ClusterError as exc:
        log.warning("%s: DGD read failed, nothing scaled this evaluation: %s", key, exc)
        return Outcome(key, "ReadFailed")
    try:
        previous = sink.previous(obj)
    except ClusterError as exc:
        if is_transient(exc):
            raise TransientClusterError(str(exc), status=exc.status) from exc
        log.warning("%s: budget status unreadable, nothing written this evaluation: %s", key, exc)
        return Outcome(key, "ReadFailed")
    try:
        dgd = parse_dgd(obj)
    except DGDInputError as exc:
        out = Outcome(key, "InvalidDeployment")
        desired = {"observedGeneration": (obj.get("metadata") or {}).get("generation"), "ready": "False",
                   "reason": "InvalidDeployment", "message": str(exc)}
        if {k: previous.get(k) for k in desired} != desired:
            sink.write(obj, desired)
            out.status_written = True
        return out
    try:
        pods = cluster.list_pods(namespace, label_selector=dgd.pod_selector)
    except ClusterError as exc:
        log.warning("%s: pod list failed, scale-ups blocked this evaluation: %s", key, exc)
        pods = None
    try:
        owners = owners_of(scaling, dgd)
        unreadable = None
    except ClusterError as exc:
        if is_transient(exc):
            raise TransientClusterError(str(exc), status=exc.status) from exc
        owners, unreadable = Owners(), f"its scaling adapters could not be read ({exc})"
    held = owned_counts(dgd, owners, [c.name for c in dgd.components])
    seen = other_writer(state.last_replicas(key), held)
    if seen and not budget.sole_writer and not state.other_writer(key):
        state.flag_other_writer(key, seen)
    now = datetime.fromtimestamp(clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    snap = Snapshot(dgd=dgd, pods=pods, budget=budget, admitted=state.admitted(key), proposal=state.proposal(key),
                    group=group, was_rolling=state.was_rolling(key), now=now, adapters=owners.replicas(),
                    other_writer=unreadable or state.other_writer(key), claim_classes=claim_classes_of(dra, dgd),
                    evidence=_read_evidence(evidence, pods, clock, key))
    res = evaluate(snap, previous)
    if res.admit is not None:
        state.admit(key, res.admit)
    state.set_rolling(key, res.rolling)
    for line in res.warnings:
        log.warning(line)
    st = res.status
    out = Outcome(key, st["reason"], ready=st["ready"] == "True", targets=dict(st.get("targets") or {}),
                  settled_w=st.get("settledWatts"), peak_w=st.get("peakWatts"), gpus=st.get("gpus"),
                  limit_w=st.get("powerLimitWatts"), reasons=list(st.get("reasons") or []),
                  over_w=st.get("overBudgetWatts", 0) if "settledWatts" in st else None)
    try:
        res = _write(cluster, sink, obj, snap, res, previous, out, scaling, owners, fence)
    finally:  # what was written is recorded even when a later write failed (a partial write)
        state.record_replicas(key, {**held, **out.replicas_written})
    if out.skipped is not None:
        return out
    state.record_figures(key, {"reason": out.reason, "limit_w": out.limit_w, "settled_w": out.settled_w,
                               "peak_w": out.peak_w, "gpus": out.gpus})
    return out
