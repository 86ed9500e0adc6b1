"""The retune loop's settings (docs/retune.md): windows, the noise guard, sweeps, leases."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from powerfleet.config.base import Strict, is_node_name

RETUNE_OBJECTIVES = ("throughput", "throughputPerGpu", "throughputPerUser", "ttft", "e2eLatency", "goodput",
                     "goodputPerGpu")


class RetuneDeploymentConfig(Strict):
    """Per-deployment overrides of the retune defaults (docs/retune.md); None inherits."""

    enabled: bool | None = None
    mode: Literal["active", "advisory"] | None = None
    namespace: str | None = None
    window_interval_s: int | None = Field(None, ge=10, le=86400)
    window_phase_s: int | None = Field(None, ge=0)
    grid: dict[str, Any] | None = None  # checked by powerfleet.retune.settings (an invalid grid stops retune)
    objective: Literal[RETUNE_OBJECTIVES] | None = None  # type: ignore[valid-type]
    sla: dict[str, float] | None = None
    min_improvement_percentage: float | None = Field(None, ge=0, allow_inf_nan=False)
    min_requests: int | None = Field(None, ge=0, le=10_000_000)
    confidence: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False)
    dwell_s: int | None = Field(None, ge=0, le=7 * 86400)
    search_rounds: int | None = Field(None, ge=0, le=50)
    shift_z: float | None = Field(None, ge=0, le=1000, allow_inf_nan=False)
    shift_min_ratio: float | None = Field(None, gt=1, le=100, allow_inf_nan=False)
    engine_profile: str | None = None  # fleet config only (the DGD annotation may not name a file)
    prefill_engine_profile: str | None = None  # fleet config only, like engine_profile
    kv_transfer_gb_s: float | None = Field(None, gt=0, le=100_000, allow_inf_nan=False)
    max_shards: int | None = Field(None, ge=1, le=256)
    time_budget_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    shard_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    trace_dir: str | None = None


class RetuneConfig(Strict):
    window_interval_s: int = Field(300, ge=10, le=86400)
    window_phase_s: int = Field(0, ge=0)
    # Deployments with retune enabled (the cluster layer adds the DGD-driven list later).
    deployments: list[str] = Field(default_factory=list)
    # Defaults for every deployment; `per_deployment.<dgd>` overrides them (and can disable one).
    mode: Literal["active", "advisory"] = "active"
    namespace: str = "default"  # the DGDs' namespace and the fleet's own (the Leases live here)
    kubeconfig: str | None = None  # None: in-cluster service account
    grid: dict[str, Any] | None = None  # None: the default 108-point grid
    objective: Literal[RETUNE_OBJECTIVES] = "ttft"  # type: ignore[valid-type]
    sla: dict[str, float] | None = None
    min_improvement_percentage: float = Field(1.0, ge=0, allow_inf_nan=False)
    # The noise guard (docs/retune.md): a window decides only with this many requests; the
    # best must beat the probe on paired batches with this one-sided confidence (0: off); a
    # parameter that moved may not move back for dwell_s seconds (whole windows: dwell_s //
    # window_interval_s, so 20 s windows hold a knob 3 windows and 300 s windows do not hold it).
    min_requests: int = Field(200, ge=0, le=10_000_000)
    confidence: float = Field(0.95, ge=0, lt=1, allow_inf_nan=False)
    dwell_s: int = Field(60, ge=0, le=7 * 86400)
    # Rounds of the search beyond the grid's edge (one fan-out each in the live loop; 0: off).
    search_rounds: int = Field(6, ge=0, le=50)
    # A load change inside the window (retune/shift.py): when the request or prompt-token rate
    # steps by at least shift_min_ratio (up or down) with Welch's t >= shift_z on 10 s bins,
    # the window is scored from the change on (the traffic before it only warms up); 0: off.
    shift_z: float = Field(5.0, ge=0, le=1000, allow_inf_nan=False)
    shift_min_ratio: float = Field(1.25, gt=1, le=100, allow_inf_nan=False)
    # The engine profile the sweeps replay (a measured table, `sim replay --profile`); None:
    # the built-in Llama-3-70B TP4 H200 roofline fit, shown as the fallback in `retune status`.
    engine_profile: str | None = None
    # A disaggregated deployment (prefill and decode pools): its prefill workers' profile
    # (None: engine_profile's), and the prefill -> decode KV link in GB/s (64: inter-node
    # InfiniBand, the P/D bandwidth of Dynamo's mocker; ~600 for NVLink). docs/sim.md.
    prefill_engine_profile: str | None = None
    kv_transfer_gb_s: float = Field(64.0, gt=0, le=100_000, allow_inf_nan=False)
    max_shards: int = Field(3, ge=1, le=256)
    time_budget_s: float = Field(240.0, gt=0, allow_inf_nan=False)
    shard_timeout_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    trace_dir: str = "/var/lib/powerfleet/traces"
    lease_duration_s: int = Field(60, ge=5, le=3600)
    lease_renew_s: int = Field(15, ge=1, le=3600)
    history: int = Field(20, ge=1, le=200)  # decisions kept in the state Lease
    # `promote` refuses an advisory recommendation older than this many windows (or one a
    # later window's keep superseded).
    promote_max_age_windows: int = Field(3, ge=0, le=10_000)
    # Frontend trace segments last written longer ago than this are deleted by the window cut
    # (it needs the window and the one before it).
    segment_retention_s: int = Field(86_400, ge=60, le=365 * 86_400)
    # Where shards read the window: "file" (a volume shared with the sweep workers) or "redis"
    # (the cut window kept in Redis until the sweep is final; no shared volume needed).
    window_store: Literal["file", "redis"] = "file"
    per_deployment: dict[str, RetuneDeploymentConfig] = Field(default_factory=dict)

    @field_validator("deployments", "per_deployment")
    @classmethod
    def _deployment_names(cls, v: Any) -> Any:
        # Lease names and Redis keys are built from them: each must be a Kubernetes object name.
        for name in v:
            if not is_node_name(name):
                raise ValueError(f"{name!r} is not a valid Kubernetes object name")
        return v

    @model_validator(mode="after")
    def _phase_within_interval(self) -> "RetuneConfig":
        if self.window_phase_s >= self.window_interval_s:
            raise ValueError("window_phase_s must be less than window_interval_s")
        if self.lease_renew_s >= self.lease_duration_s:
            raise ValueError("retune.lease_renew_s must be less than retune.lease_duration_s")
        return self
