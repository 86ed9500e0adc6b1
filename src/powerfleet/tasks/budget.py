"""Budget tasks: the tick that fans out one evaluation per power-aware DGD, the evaluation, and
the task API's proposals and re-admission (docs/budget.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from powerfleet.beat.ticklog import TickLog
from powerfleet.tasks.base import NoArgs, TaskArgs, TaskInputError, fleet_task
from powerfleet.tasks.ports import clock, fleet_redis

Role = Literal["prefill", "decode", "worker"]
_clusters: dict[str | None, Any] = {}


def _cluster(app: Any) -> Any:
    from powerfleet.cluster.kube import KubeCluster

    kubeconfig = app.fleet_config.budget.kubeconfig
    if kubeconfig not in _clusters:
        _clusters[kubeconfig] = (KubeCluster.from_kubeconfig(kubeconfig, component="powerfleet-budget") if kubeconfig
                                 else KubeCluster.in_cluster(component="powerfleet-budget"))
    return _clusters[kubeconfig]


_pod_views: dict[str | None, Any] = {}


def _ledger_pods(app: Any) -> Any:
    """Where this process reads every pod from (budget.pod_source): a LIST per call, or the
    process's own watch-backed view (started on first use, in the worker process that uses it:
    a thread does not survive the prefork pool's fork)."""
    from powerfleet.cluster.gpu_pods import KubeGpuPods

    cfg = app.fleet_config.budget
    if cfg.pod_source == "list":
        return KubeGpuPods(_cluster(app))
    if cfg.kubeconfig not in _pod_views:
        from powerfleet.budget.tick import ledger_reads
        from powerfleet.cluster.gpu_pod_cache import GpuPodCache
        from powerfleet.cluster.keepalive import watch_api_client
        from powerfleet.cluster.kube import KubeCluster

        watcher = KubeCluster(watch_api_client(cfg.kubeconfig), component="powerfleet-budget")
        _pod_views[cfg.kubeconfig] = GpuPodCache(KubeGpuPods(watcher), keep=ledger_reads).start()
    return _pod_views[cfg.kubeconfig]


_scalings: dict[str | None, Any] = {}


def _scaling(app: Any) -> Any:
    """One scaling-adapter reader per cluster, so "no adapters served" is remembered between evaluations."""
    from powerfleet.cluster.scaling import KubeScaling

    kubeconfig = app.fleet_config.budget.kubeconfig
    if kubeconfig not in _scalings:
        _scalings[kubeconfig] = KubeScaling(_cluster(app))
    return _scalings[kubeconfig]


def _sink(app: Any) -> Any:
    """Where this evaluation persists the status (budget.status_store; budget/persist.py)."""
    from powerfleet.budget.persist import ConfigMapStatus, DgdStatus
    from powerfleet.cluster.budget_store import KubeBudgetStore

    cluster = _cluster(app)
    if app.fleet_config.budget.status_store == "dgd":
        return DgdStatus(cluster)
    return ConfigMapStatus(KubeBudgetStore(cluster))


def _state(app: Any) -> Any:
    from powerfleet.budget.state import BudgetState

    return BudgetState(fleet_redis(app))


def _configured(app: Any, task: str, deployment: str) -> Any:
    cfg = app.fleet_config.budget.deployments.get(deployment)
    if cfg is None:
        raise TaskInputError(f"{task}: deployment: {deployment!r} is not power-aware (not in budget.deployments)")
    return cfg


class BudgetTickResult(TaskArgs):
    at: float
    evaluations: list[str]
    skipped: dict[str, str] = Field(default_factory=dict)
    # oversubscribed group -> "admitted" or the reason admission is closed (power/admission.py)
    admission: dict[str, str] = Field(default_factory=dict)
    task_ids: dict[str, str] = Field(default_factory=dict)  # deployment -> its budget.evaluate task id
    generation: int | None = None  # the generation its allocation was published under (budget/generations.py)


class EvaluateArgs(TaskArgs):
    deployment: str = Field(min_length=3, max_length=507, pattern=r"^[^/]+/[^/]+$")
    # The tick's generation (budget/generations.py), never a limit: the allowance is read from Redis
    # when the evaluation runs, and an outdated generation is skipped. None: sent by hand, no allowance.
    generation: int | None = Field(None, ge=0, le=2**62)


EVALUATION_BATCH = 500  # deployments per budget.evaluate_batch: they share one snapshot (budget/batch.py)


class EvaluateBatchArgs(TaskArgs):
    deployments: list[Annotated[str, Field(min_length=3, max_length=507, pattern=r"^[^/]+/[^/]+$")]] = Field(
        min_length=1, max_length=EVALUATION_BATCH)
    generation: int = Field(ge=0, le=2**62)  # the tick's (budget/generations.py); never a limit


class EvaluateResult(TaskArgs):
    deployment: str
    reason: str
    ready: bool
    targets: dict[str, int | None]
    settled_w: int | None
    peak_w: int | None
    gpus: int | None
    limit_w: int | None
    reasons: list[str]
    over_w: int | None = None  # watts held above the limit (0: within it; None: not planned)
    replicas_written: dict[str, int]
    status_written: bool
    events: list[str]
    skipped: str | None = None  # why nothing was applied (reason Outdated: its tick is no longer the newest)


class EvaluateBatchResult(TaskArgs):
    results: dict[str, EvaluateResult]  # deployment -> its evaluation
    # sent again as a budget.evaluate each (same generation): a transient API error on their turn,
    # or the batch's snapshot unreadable (why)
    resent: list[str] = Field(default_factory=list)
    why: str | None = None


class ProposeArgs(TaskArgs):
    deployment: str = Field(min_length=3, max_length=507, pattern=r"^[^/]+/[^/]+$")
    # Bounded here, so a negative or absurd count is refused at send time, not in the worker.
    replicas: dict[Role, Annotated[int, Field(ge=0, le=100_000)]] = Field(min_length=1)
    source: str = Field("task-api", max_length=100)


class ProposeLoadArgs(TaskArgs):
    deployment: str = Field(min_length=3, max_length=507, pattern=r"^[^/]+/[^/]+$")
    load: dict[Role, float] = Field(min_length=1)  # e.g. active requests per role, from frontend metrics
    target_per_replica: dict[Role, float] = Field(min_length=1)

    @model_validator(mode="after")
    def _counts_a_role_can_have(self) -> "ProposeLoadArgs":
        # The same rule the task applies, so an impossible ratio is refused where it is sent
        # (trigger, Flower), not only in the worker.
        from powerfleet.budget.load import replicas_for_load

        replicas_for_load(self.load, self.target_per_replica)
        return self


class ProposeResult(TaskArgs):
    deployment: str
    replicas: dict[str, int]
    at: float
    source: str


class DeploymentArgs(TaskArgs):
    deployment: str = Field(min_length=3, max_length=507, pattern=r"^[^/]+/[^/]+$")


class ReadmitResult(TaskArgs):
    deployment: str
    forgot: bool


@fleet_task("powerfleet.budget.tick", NoArgs, acks_late=False, manual=True)
def budget_tick(self: Any, params: NoArgs) -> BudgetTickResult:
    now = clock.now()
    cfg = self.app.fleet_config.budget
    log = TickLog(fleet_redis(self.app))
    if not cfg.deployments:
        log.record("budget", now, self.request.origin, "no deployments to evaluate")
        return BudgetTickResult(at=now, evaluations=[])
    from powerfleet.budget import metrics
    from powerfleet.budget.evidence import RedisReports
    from powerfleet.budget.generations import Allocations
    from powerfleet.budget.tick import tick_limits
    from powerfleet.cluster.dra import KubeDra
    from powerfleet.cluster.ports import ClusterError
    from powerfleet.power.admission import admission_rule

    fresh_s = 3 * self.app.fleet_config.beat.reconcile_interval_s  # an agent report older than this is no evidence
    allocations = Allocations(fleet_redis(self.app))
    generation = allocations.open(now)  # from here on, every earlier tick's evaluation is outdated
    try:
        plan = tick_limits(_cluster(self.app), _state(self.app), cfg.deployments, cfg.groups, cfg.group_label,
                           _ledger_pods(self.app), RedisReports(fleet_redis(self.app), now), now=now,
                           fresh_s=fresh_s, max_settable_w=cfg.max_settable_gpu_w, dra=KubeDra(_cluster(self.app)),
                           evidence_mode=cfg.enforcement_evidence,
                           oversubscription=admission_rule(self.app.fleet_config, fleet_redis(self.app)))
    except ClusterError as exc:
        # Without the group view no allowance can be proven safe: evaluate nothing this tick.
        detail = f"group view unreadable, no evaluation sent: {exc}"
        log.record("budget", now, self.request.origin, detail)
        return BudgetTickResult(at=now, evaluations=[], skipped={k: detail for k in cfg.deployments})
    for group, watts in cfg.groups.items():
        metrics.record_group(group, watts, plan.group_current.get(group, 0), plan.group_peak_bound.get(group, 0),
                             unmanaged_w=plan.group_unmanaged.get(group, 0), measured_w=plan.group_measured.get(group))
    _state(self.app).record_groups(now, {g: {"limit_w": w, "projected_w": plan.group_current.get(g, 0),
                                             "peak_w": plan.group_peak_bound.get(g, 0),
                                             "measured_w": plan.group_measured.get(g)} for g, w in cfg.groups.items()})
    admission = _admission(plan.group_admission)
    if not allocations.publish(generation, plan.limits):
        detail = f"superseded: a later tick opened before generation {generation} was published, no evaluation sent"
        log.record("budget", now, self.request.origin, detail)
        return BudgetTickResult(at=now, evaluations=[], skipped={k: detail for k in plan.limits},
                                admission=admission, generation=None)
    sent, ids, keys = [], {}, list(plan.limits)
    for i in range(0, len(keys), EVALUATION_BATCH):  # each batch shares one snapshot (budget/batch.py)
        batch = keys[i:i + EVALUATION_BATCH]
        task = self.app.send_task("powerfleet.budget.evaluate_batch",
                                  kwargs={"deployments": batch, "generation": generation},
                                  expires=self.app.fleet_config.beat.budget_interval_s)
        ids.update(dict.fromkeys(batch, task.id))
        sent.extend(batch)
    log.record("budget", now, self.request.origin, (f"budget.evaluate -> {', '.join(sent)}" if sent else
               "no configured deployment found") + "".join(f"; {a.admission.message}"
                                                          for a in plan.group_admission.values()))
    return BudgetTickResult(at=now, evaluations=sent, skipped=plan.skipped, admission=admission, task_ids=ids,
                            generation=generation)


def _admission(got: dict[str, Any]) -> dict[str, str]:
    """Each oversubscribed group's admission, as a metric and as the tick's result."""
    from powerfleet.power import metrics as power_metrics

    for group, cap in got.items():
        power_metrics.record_admission(group, cap.watts, cap.admission.reason)
    return {g: cap.admission.reason or "admitted" for g, cap in got.items()}


# By hand only ``deployment``: the group fields are the tick's (a hand-sent limit would be authority).
@fleet_task("powerfleet.budget.evaluate", EvaluateArgs, acks_late=False, manual=("deployment",),
            max_retries=2, default_retry_delay=2)
def budget_evaluate(self: Any, params: EvaluateArgs) -> EvaluateResult:
    from powerfleet.budget.runner import TransientClusterError

    _configured(self.app, "powerfleet.budget.evaluate", params.deployment)
    try:
        return _evaluation(self.app, params.deployment, params.generation, _cluster(self.app), _sink(self.app),
                           _scaling(self.app))
    except TransientClusterError as exc:  # only transient API errors are retried
        raise self.retry(exc=exc)


@fleet_task("powerfleet.budget.evaluate_batch", EvaluateBatchArgs, acks_late=False)
def budget_evaluate_batch(self: Any, params: EvaluateBatchArgs) -> EvaluateBatchResult:
    """A tick's evaluations on one snapshot of the cluster (budget/batch.py): only their writes
    reach the API server. One that meets a transient API error is sent again on its own."""
    from powerfleet.budget.batch import (BatchState, PrefetchedReports, SnapshotCluster, SnapshotScaling,
                                         SnapshotStatus, read_snapshot)
    from powerfleet.budget.evidence import RedisReports
    from powerfleet.budget.generations import Allocations, Read
    from powerfleet.budget.persist import DgdStatus
    from powerfleet.budget.runner import TransientClusterError
    from powerfleet.cluster.budget_store import KubeBudgetStore
    from powerfleet.cluster.ports import ClusterError

    for key in params.deployments:
        _configured(self.app, "powerfleet.budget.evaluate_batch", key)
    cluster = _cluster(self.app)

    def resend(keys: list[str]) -> None:
        for key in keys:
            self.app.send_task("powerfleet.budget.evaluate", kwargs={"deployment": key, "generation": params.generation},
                               countdown=2, expires=self.app.fleet_config.beat.budget_interval_s)

    try:
        snap = read_snapshot(cluster, _scaling(self.app), params.deployments, pods=_ledger_pods(self.app))
    except ClusterError as exc:  # each then reads for itself, with its own retries
        resend(params.deployments)
        return EvaluateBatchResult(results={}, resent=params.deployments, why=f"snapshot unreadable: {exc}")
    view = SnapshotCluster(cluster, snap)
    sink = (DgdStatus(view) if self.app.fleet_config.budget.status_store == "dgd"
            else SnapshotStatus(KubeBudgetStore(cluster), snap))
    scaling = SnapshotScaling(_scaling(self.app), snap)
    # Redis too, once for the batch: the state, the allocations, the reports of the pods' nodes
    r = fleet_redis(self.app)
    state, (newest, published, records) = BatchState(_state(self.app), r), Allocations(r).read_all()
    nodes = [p.node_name for pods in snap.pods.values() for p in pods if p.node_name]
    reports = (None if self.app.fleet_config.budget.enforcement_evidence == "off"
               else PrefetchedReports(RedisReports(r, clock.now()), nodes))
    results, failed = {}, []
    for key in params.deployments:
        try:
            results[key] = _evaluation(self.app, key, params.generation, view, sink, scaling, state=state,
                                       read=Read(params.generation, newest, published, records.get(key)),
                                       reports=reports)
        except TransientClusterError:
            failed.append(key)
    resend(failed)
    return EvaluateBatchResult(results=results, resent=failed, why="transient API errors" if failed else None)


def _evaluation(app: Any, deployment: str, generation: int | None, cluster: Any, sink: Any, scaling: Any, *,
                state: Any = None, read: Any = None, reports: Any = None) -> EvaluateResult:
    """One evaluation: its allowance read from Redis (a skip when outdated), then the program.
    A batch passes its state, allocation ``read`` and enforcement ``reports``, each read once for
    all its deployments. Raises TransientClusterError for the caller to retry."""
    from powerfleet.budget import metrics
    from powerfleet.budget.evidence import EvidenceSource, RedisReports
    from powerfleet.budget.generations import Allocations, verdict
    from powerfleet.budget.program import GroupLimit
    from powerfleet.budget.runner import budget_of, evaluate_deployment
    from powerfleet.cluster.dra import KubeDra

    bcfg = app.fleet_config.budget
    cfg = bcfg.deployments[deployment]
    allocations, fence = Allocations(fleet_redis(app)), None
    if generation is not None:  # sent by a tick: its allowance is read from Redis, now
        got = read if read is not None else allocations.read(generation, deployment)
        group = verdict(got, clock.now(), 2 * app.fleet_config.beat.budget_interval_s)
        if isinstance(group, str):
            return _skip(deployment, group)

        def fence() -> str | None:  # checked again just before anything is written
            return allocations.outdated(generation)
    elif bcfg.groups:
        group = GroupLimit("(evaluated outside a tick)", None)  # no allowance: scale-ups blocked
    else:
        group = None
    evidence = None if bcfg.enforcement_evidence == "off" else EvidenceSource(
        reports or RedisReports(fleet_redis(app), clock.now()), 3 * app.fleet_config.beat.reconcile_interval_s,
        bcfg.max_settable_gpu_w, bcfg.enforcement_evidence)
    out = evaluate_deployment(cluster, state or _state(app), deployment, budget_of(cfg), group, clock, sink, scaling,
                              KubeDra(cluster), evidence, fence=fence)
    if out.skipped is not None:
        return _skip(deployment, out.skipped)
    metrics.record_evaluation(deployment, out.reason, out.limit_w, out.settled_w, out.peak_w, out.gpus,
                              out.reasons, out.over_w, scaled=bool(out.replicas_written))
    return EvaluateResult(**{k: getattr(out, k) for k in EvaluateResult.model_fields})


def _skip(deployment: str, why: str) -> EvaluateResult:
    """A recorded skip: nothing read was applied (its tick is outdated, or never published this allocation)."""
    import logging

    from powerfleet.budget import metrics

    logging.getLogger("powerfleet.budget").info("%s: evaluation skipped, %s", deployment, why)
    metrics.record_evaluation(deployment, "Outdated", None, None, None, None, ())
    return EvaluateResult(deployment=deployment, reason="Outdated", ready=False, targets={}, settled_w=None,
                          peak_w=None, gpus=None, limit_w=None, reasons=[], replicas_written={}, status_written=False,
                          events=[], skipped=why)


@fleet_task("powerfleet.budget.propose", ProposeArgs, acks_late=True, manual=True)
def budget_propose(self: Any, params: ProposeArgs) -> ProposeResult:
    """Store a proposal ({role: count}); the last one written wins and survives restarts."""
    _configured(self.app, "powerfleet.budget.propose", params.deployment)
    if any(n < 0 for n in params.replicas.values()):
        raise TaskInputError("powerfleet.budget.propose: replicas: counts must be non-negative")
    rec = _state(self.app).propose(params.deployment, params.replicas, at=clock.now(), source=params.source)
    return ProposeResult(deployment=params.deployment, **rec)


@fleet_task("powerfleet.budget.propose_load", ProposeLoadArgs, acks_late=True, manual=True)
def budget_propose_load(self: Any, params: ProposeLoadArgs) -> ProposeResult:
    """Turn a load signal into a proposal: replicas = ceil(load / target per replica), at least 1."""
    from powerfleet.budget.load import replicas_for_load

    _configured(self.app, "powerfleet.budget.propose_load", params.deployment)
    try:
        replicas = replicas_for_load(params.load, params.target_per_replica)
    except ValueError as exc:
        raise TaskInputError(f"powerfleet.budget.propose_load: {exc}") from None
    rec = _state(self.app).propose(params.deployment, replicas, at=clock.now(), source="load")
    return ProposeResult(deployment=params.deployment, **rec)


@fleet_task("powerfleet.budget.readmit", DeploymentArgs, acks_late=True, manual=True)
def budget_readmit(self: Any, params: DeploymentArgs) -> ReadmitResult:
    """Forget the admitted power inputs (and a detected other writer of the replicas); the next
    evaluation admits them again from a settled snapshot."""
    _configured(self.app, "powerfleet.budget.readmit", params.deployment)
    return ReadmitResult(deployment=params.deployment, forgot=_state(self.app).forget_admission(params.deployment))
