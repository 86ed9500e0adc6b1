"""Per-deployment retune settings: fleet defaults < ``retune.per_deployment.<dgd>`` < the
DGD's own ``powerfleet.nvidia.com/retune`` annotation (a JSON object of the same keys).

``resolve`` validates what the config model cannot (the grid against the router domain, the
SLA, the objective's needs) and stops with one clear ``SettingsError``: an invalid grid never
leaves retune with nothing to search. ``generation`` fingerprints everything that changes
what a sweep means, so work launched under an older configuration can be recognised and
dropped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from powerfleet.config.fleet import RetuneConfig, RetuneDeploymentConfig
from powerfleet.retune.guard import NoiseGuard
from powerfleet.retune.grid import DEFAULT_GRID, EdgeSearch, SweepGrid, parse_grid
from powerfleet.retune.objectives import Objective, parse_objective
from powerfleet.retune.shift import ShiftRule
from powerfleet.retune.windows import last_closed_window
from powerfleet.sim.disagg import DEFAULT_KV_TRANSFER_GB_S, Pools
from powerfleet.sim.policy import RouterPolicy, first_error, parse_sla
from powerfleet.sim.profile import default_profile, load_profile

DGD_ANNOTATION = "powerfleet.nvidia.com/retune"


class SettingsError(ValueError):
    """A deployment's retune settings are invalid; one line naming the key."""


@dataclass(frozen=True)
class DeploymentSettings:
    dgd: str
    namespace: str
    enabled: bool
    mode: str  # "active" | "advisory"
    interval_s: int
    phase_s: int
    grid: SweepGrid
    objective: Objective
    sla: dict[str, float] | None
    min_improvement_pct: float
    max_shards: int
    time_budget_s: float
    shard_timeout_s: float
    trace_dir: str
    lease_duration_s: int
    lease_renew_s: int
    history: int
    window_store: str  # "file" | "redis"
    generation: str
    guard: NoiseGuard = NoiseGuard()
    promote_max_age_windows: int = 3
    engine_profile: str | None = None  # a profile file every shard loads; None: the built-in profile
    engine_profile_name: str = ""
    # A disaggregated deployment's prefill pool profile (None: engine_profile's) and KV link.
    prefill_engine_profile: str | None = None
    prefill_engine_profile_name: str = ""
    kv_transfer_gb_s: float = DEFAULT_KV_TRANSFER_GB_S
    kv_bytes_per_token: int | None = None  # what the transfer moves (the prefill profile's, else the decode's)
    search: EdgeSearch = EdgeSearch()  # the edge search every sweep runs (live, `retune sweep`, bench)
    shift: ShiftRule | None = ShiftRule()  # the load-change detector of the window's scoring (None: off)

    def searched_credit_positive(self) -> bool:
        spec = self.grid.overlap_score_credit
        return spec is not None and any(v > 0 for v in spec.values())


# The window schedule comes from the fleet config only: a sender (trigger, Flower, the tick)
# must be able to bound a window index without reading the DGD (``closed_window``).
SCHEDULE_KEYS = ("window_interval_s", "window_phase_s", "engine_profile", "prefill_engine_profile")


def sweep_options(s: DeploymentSettings) -> dict[str, Any]:
    """The options every sweep of these settings runs with: ``run_sweep(**sweep_options(s))``
    is what the live window computes (tests/retune/test_one_path.py), and what bench/retune.py
    and the defaults of `retune sweep` use."""
    return {"max_shards": s.max_shards, "min_improvement_pct": s.min_improvement_pct, "search": s.search,
            "guard": s.guard, "budget_s": s.time_budget_s,
            "profile": load_profile(s.engine_profile) if s.engine_profile is not None else None}


def pools(s: DeploymentSettings, prefill: int, decode: int) -> Pools:
    """What a sweep of a disaggregated deployment replays (``run_sweep(requests, pools(...), ...)``):
    its replica counts, the prefill profile (the decode pool takes ``sweep_options``' profile)
    and the KV link."""
    pre = load_profile(s.prefill_engine_profile) if s.prefill_engine_profile is not None else None
    return Pools(prefill, decode, prefill_profile=pre, kv_transfer_gb_s=s.kv_transfer_gb_s)


def dgd_overrides(annotations: dict[str, str]) -> RetuneDeploymentConfig | None:
    raw = annotations.get(DGD_ANNOTATION)
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SettingsError(f"annotation {DGD_ANNOTATION}: not JSON ({getattr(exc, 'msg', 'nested too deeply')})") from None
    if isinstance(obj, dict) and any(k in obj for k in SCHEDULE_KEYS):
        raise SettingsError(f"annotation {DGD_ANNOTATION}: window_interval_s, window_phase_s and the engine "
                            "profiles are set in the fleet config (retune.per_deployment), not on the DGD")
    try:
        return RetuneDeploymentConfig.model_validate(obj)
    except ValidationError as exc:
        raise SettingsError(f"annotation {DGD_ANNOTATION}: {first_error(exc)}") from None


def _merged(cfg: RetuneConfig, dgd: str, extra: RetuneDeploymentConfig | None) -> dict[str, Any]:
    base: dict[str, Any] = {k: getattr(cfg, k) for k in RetuneDeploymentConfig.model_fields if k != "enabled"}
    base["window_interval_s"], base["window_phase_s"] = cfg.window_interval_s, cfg.window_phase_s
    base["enabled"] = dgd in cfg.deployments
    for layer in (cfg.per_deployment.get(dgd), extra):
        if layer is not None:
            base.update({k: v for k, v in layer.model_dump().items() if v is not None})
    return base


def schedule(cfg: RetuneConfig, dgd: str) -> tuple[int, int]:
    """(interval_s, phase_s) of ``dgd``'s windows: fleet defaults < ``retune.per_deployment``."""
    over = cfg.per_deployment.get(dgd)
    interval = over.window_interval_s if over is not None and over.window_interval_s is not None else cfg.window_interval_s
    phase = over.window_phase_s if over is not None and over.window_phase_s is not None else cfg.window_phase_s
    return interval, phase


def closed_window(cfg: RetuneConfig, dgd: str, now: float) -> int:
    """The index of ``dgd``'s newest closed window at ``now`` (``ValueError``: bad schedule)."""
    interval, phase = schedule(cfg, dgd)
    return last_closed_window(now, interval, phase).index


def configured(cfg: RetuneConfig) -> list[str]:
    """Every deployment the fleet config names for retune (enabled or explicitly disabled)."""
    return sorted(set(cfg.deployments) | set(cfg.per_deployment))


def resolve(cfg: RetuneConfig, dgd: str, extra: RetuneDeploymentConfig | None = None) -> DeploymentSettings:
    m = _merged(cfg, dgd, extra)
    where = f"retune settings of {dgd!r}"
    if not 0 <= m["window_phase_s"] < m["window_interval_s"]:
        raise SettingsError(f"{where}: window_phase_s must be in [0, window_interval_s)")
    try:
        grid = DEFAULT_GRID if m["grid"] is None else parse_grid(m["grid"])
        points = grid.points(RouterPolicy())  # every value inside the router domain
        sla = parse_sla(m["sla"])
        objective = parse_objective(m["objective"])
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    if not points:
        raise SettingsError(f"{where}: the grid has no point to search")
    if objective in (Objective.goodput, Objective.goodputPerGpu) and sla is None:
        raise SettingsError(f"{where}: objective {objective.value} needs an sla")
    if m["time_budget_s"] <= m["shard_timeout_s"]:
        raise SettingsError(f"{where}: time_budget_s ({m['time_budget_s']:g}) must exceed shard_timeout_s "
                            f"({m['shard_timeout_s']:g}) so a sweep can finish inside its budget")
    if m["time_budget_s"] >= m["window_interval_s"]:
        raise SettingsError(f"{where}: time_budget_s must be shorter than the window interval, or sweeps overlap")
    profile_name, kvb = _profile_name(where, "engine_profile", m["engine_profile"],
                                      (default_profile().name, default_profile().kv_bytes_per_token))
    prefill_name, prefill_kvb = _profile_name(where, "prefill_engine_profile", m["prefill_engine_profile"],
                                              (profile_name, kvb))
    sweep_keys = {"grid": grid.model_dump(exclude_none=True), "profile": [m["engine_profile"], profile_name], "objective": objective.value,
                  "prefill_profile": [m["prefill_engine_profile"], prefill_name], "kv_transfer_gb_s": m["kv_transfer_gb_s"],
                  "sla": sla.model_dump(exclude_none=True) if sla else None,
                  "min_improvement_pct": m["min_improvement_percentage"], "max_shards": m["max_shards"],
                  "guard": [m["min_requests"], m["confidence"], m["dwell_s"]], "search": m["search_rounds"],
                  "shift": [m["shift_z"], m["shift_min_ratio"]],
                  "interval": m["window_interval_s"], "phase": m["window_phase_s"], "mode": m["mode"],
                  "trace_dir": m["trace_dir"], "window_store": cfg.window_store}
    generation = hashlib.sha256(json.dumps(sweep_keys, sort_keys=True).encode()).hexdigest()[:16]
    return DeploymentSettings(
        dgd=dgd, namespace=m["namespace"], enabled=bool(m["enabled"]), mode=m["mode"],
        interval_s=m["window_interval_s"], phase_s=m["window_phase_s"], grid=grid, objective=objective,
        sla=sweep_keys["sla"], min_improvement_pct=float(m["min_improvement_percentage"]),
        max_shards=m["max_shards"], time_budget_s=float(m["time_budget_s"]),
        shard_timeout_s=float(m["shard_timeout_s"]), trace_dir=m["trace_dir"],
        lease_duration_s=cfg.lease_duration_s, lease_renew_s=cfg.lease_renew_s, history=cfg.history,
        window_store=cfg.window_store,
        generation=generation,
        guard=NoiseGuard(min_requests=m["min_requests"], confidence=m["confidence"],
                         dwell_windows=m["dwell_s"] // m["window_interval_s"]),
        search=EdgeSearch(enabled=m["search_rounds"] > 0, max_rounds=m["search_rounds"]),
        shift=ShiftRule(z=m["shift_z"], min_ratio=m["shift_min_ratio"]) if m["shift_z"] > 0 else None,
        promote_max_age_windows=cfg.promote_max_age_windows,
        engine_profile=m["engine_profile"], engine_profile_name=profile_name,
        prefill_engine_profile=m["prefill_engine_profile"], prefill_engine_profile_name=prefill_name,
        kv_transfer_gb_s=float(m["kv_transfer_gb_s"]), kv_bytes_per_token=prefill_kvb or kvb,
    )


def _profile_name(where: str, key: str, path: str | None, fallback: tuple[str, int | None]) -> tuple[str, int | None]:
    """(name, KV bytes per token) of the profile a key names (checked now: a bad file stops the
    deployment in one line), or ``fallback``."""
    if path is None:
        return fallback
    try:
        prof = load_profile(path)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{where}: {key}: {exc}") from None
    return prof.name, prof.kv_bytes_per_token
