"""FleetConfig: every section of the config in one frozen model."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from powerfleet.config.agent import AgentConfig
from powerfleet.config.base import Strict, is_node_name
from powerfleet.config.budget import BudgetConfig, PowerConfig
from powerfleet.config.processes import (BeatConfig, BrokerConfig, FlowerConfig, MetricsConfig, TaskApiConfig,
                                         TimeLimits)
from powerfleet.config.retune import RetuneConfig


class FleetConfig(Strict):
    broker: BrokerConfig = BrokerConfig()
    beat: BeatConfig = BeatConfig()
    limits: TimeLimits = TimeLimits()
    flower: FlowerConfig = FlowerConfig()
    task_api: TaskApiConfig = TaskApiConfig()
    metrics: MetricsConfig = MetricsConfig()
    retune: RetuneConfig = RetuneConfig()
    agent: AgentConfig = AgentConfig()
    budget: BudgetConfig = BudgetConfig()
    power: PowerConfig = PowerConfig()
    # GPU nodes always sent a reconcile pass (optional: live agents are found by their heartbeat).
    nodes: list[str] = Field(default_factory=list)
    # Workers that consume the sweep queue always prefetch one task (long shards must not be hoarded).
    prefetch_multiplier: int = Field(4, ge=1, le=64)
    # Tests and the twin only: tasks read "now" (epoch seconds) from this file instead of the
    # system clock, so several worker processes see the same chosen instants.
    clock_file: str | None = None

    @model_validator(mode="after")
    def _visibility_outlasts_tasks(self) -> "FleetConfig":
        # Redis redelivers an unacked (acks_late) message after the visibility timeout, so a
        # task allowed to run longer would run twice in parallel.
        family, hard = max(((f, getattr(self.limits, f).hard_s) for f in ("control", "sweep", "node")),
                           key=lambda x: x[1])
        if hard >= self.broker.visibility_timeout_s:
            raise ValueError(f"broker.visibility_timeout_s ({self.broker.visibility_timeout_s}) must exceed the "
                             f"longest hard time limit (limits.{family}.hard_s = {hard:g})")
        return self

    @field_validator("nodes")
    @classmethod
    def _node_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not is_node_name(name):
                raise ValueError(f"{name!r} is not a valid Kubernetes node name")
        if len(set(v)) != len(v):
            raise ValueError("node names must be unique")
        return v
