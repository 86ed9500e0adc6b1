"""One FleetConfig for every process, loaded from YAML plus POWERFLEET_* environment overrides."""

from powerfleet.config.fleet import (
    BeatConfig,
    BrokerConfig,
    SentinelConfig,
    ConfigError,
    FleetConfig,
    FlowerConfig,
    MetricsConfig,
    RetuneConfig,
    TimeLimit,
    TimeLimits,
    load_config,
)

__all__ = [
    "BeatConfig",
    "BrokerConfig",
    "SentinelConfig",
    "ConfigError",
    "FleetConfig",
    "FlowerConfig",
    "MetricsConfig",
    "RetuneConfig",
    "TimeLimit",
    "TimeLimits",
    "load_config",
]
