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


class EvaluateArgs(TaskArgs):
    deployment: str = Field(min_length=3, max_length=507, pattern=r"^[^/]+/[^/]+$")
    group: str | None = None  # set by the tick: the budgeted group(s) the deployment draws from
    group_limit_w: int | None = Field(None, ge=0)
    group_minimum_w: int = Field(0, ge=0)
    group_current_w: int = Field(0, ge=0)
    group_gpu_capacity: int | None = Field(None, ge=0)  # the GPUs it may hold on its groups (None: no ceiling)
    # why an oversubscribed group it may land on admits no growth (power/admission.py; None: it admits)
    group_admission: str | None = Field(None, max_length=4000)
    from_tick: bool = False


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
    from powerfleet.budget.tick import tick_limits
    from powerfleet.cluster.dra import KubeDra
    from powerfleet.cluster.gpu_pods import KubeGpuPods
    from powerfleet.cluster.ports import ClusterError
    from powerfleet.power.admission import admission_rule

    fresh_s = 3 * self.app.fleet_config.beat.reconcile_interval_s  # an agent report older than this is no evidence
    try:
        plan = tick_limits(_cluster(self.app), _state(self.app), cfg.deployments, cfg.groups, cfg.group_label,
                           KubeGpuPods(_cluster(self.app)), RedisReports(fleet_redis(self.app), now), now=now,
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
    sent, ids = [], {}
    for key, gl in plan.limits.items():
        ids[key] = self.app.send_task("powerfleet.budget.evaluate", kwargs={
            "deployment": key, "group": gl.group, "group_limit_w": gl.limit_w, "group_minimum_w": gl.minimum_w,
            "group_current_w": gl.current_w, "group_gpu_capacity": gl.gpu_capacity, "group_admission": gl.admission,
            "from_tick": True}, expires=self.app.fleet_config.beat.budget_interval_s).id
        sent.append(key)
    log.record("budget", now, self.request.origin, (f"budget.evaluate -> {', '.join(sent)}" if sent else
               "no configured deployment found") + "".join(f"; {a.admission.message}"
                                                          for a in plan.group_admission.values()))
    return BudgetTickResult(at=now, evaluations=sent, skipped=plan.skipped, admission=admission, task_ids=ids)


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
    from powerfleet.budget import metrics
    from powerfleet.budget.program import GroupLimit
    from powerfleet.budget.runner import TransientClusterError, budget_of, evaluate_deployment

    bcfg = self.app.fleet_config.budget
    cfg = _configured(self.app, "powerfleet.budget.evaluate", params.deployment)
    if params.from_tick:
        group = GroupLimit(params.group, params.group_limit_w, params.group_minimum_w, params.group_current_w,
                           params.group_gpu_capacity, params.group_admission)
    elif bcfg.groups:
        group = GroupLimit("(evaluated outside a tick)", None)  # no allowance: scale-ups blocked
    else:
        group = None
    try:
        from powerfleet.budget.evidence import EvidenceSource, RedisReports
        from powerfleet.cluster.dra import KubeDra

        cluster = _cluster(self.app)
        evidence = None if bcfg.enforcement_evidence == "off" else EvidenceSource(
            RedisReports(fleet_redis(self.app), clock.now()), 3 * self.app.fleet_config.beat.reconcile_interval_s,
            bcfg.max_settable_gpu_w, bcfg.enforcement_evidence)
        out = evaluate_deployment(cluster, _state(self.app), params.deployment, budget_of(cfg), group, clock,
                                  _sink(self.app), _scaling(self.app), KubeDra(cluster), evidence)
    except TransientClusterError as exc:  # only transient API errors are retried
        raise self.retry(exc=exc)
    metrics.record_evaluation(params.deployment, out.reason, out.limit_w, out.settled_w, out.peak_w, out.gpus,
                              out.reasons, out.over_w)
    return EvaluateResult(**{k: getattr(out, k) for k in EvaluateResult.model_fields})


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
