"""FleetConfig: the single config object every powerfleet process is built from.

Sources, later wins: built-in defaults < YAML file (``--config`` or ``POWERFLEET_CONFIG``) <
``POWERFLEET_*`` environment variables. Nested keys use a double underscore in the variable
name: ``POWERFLEET_BEAT__RECONCILE_INTERVAL_S=5`` sets ``beat.reconcile_interval_s``. Values
from the environment are parsed as YAML scalars/flow collections, so ``[a, b]`` is a list.

Every validation failure becomes one ConfigError naming the source and the dotted key.
"""

from powerfleet.config.agent import AgentConfig
from powerfleet.config.base import NAMESPACE, ConfigError, Strict, is_node_name
from powerfleet.config.budget import BudgetConfig, DeploymentBudgetConfig, GroupBudgetConfig, PowerConfig
from powerfleet.config.loading import ENV_CONFIG_FILE, ENV_PREFIX, load_config
from powerfleet.config.model import FleetConfig
from powerfleet.config.processes import (BeatConfig, BrokerConfig, FlowerConfig, MetricsConfig, SentinelConfig,
                                         TaskApiConfig, TimeLimit, TimeLimits)
from powerfleet.config.retune import RETUNE_OBJECTIVES, RetuneConfig, RetuneDeploymentConfig

# Split by concern (issue 37): base (errors, names), processes (broker, beat, limits, Flower, task
# API, metrics), retune, agent, budget (and power), model (FleetConfig), loading (load_config).
# Every name importers used from this module stays importable from it.
__all__ = [
    "AgentConfig", "BeatConfig", "BrokerConfig", "BudgetConfig", "ConfigError", "DeploymentBudgetConfig",
    "ENV_CONFIG_FILE", "ENV_PREFIX", "FleetConfig", "FlowerConfig", "GroupBudgetConfig", "MetricsConfig",
    "NAMESPACE", "PowerConfig", "RETUNE_OBJECTIVES", "RetuneConfig", "RetuneDeploymentConfig", "SentinelConfig",
    "Strict", "TaskApiConfig", "TimeLimit", "TimeLimits", "is_node_name", "load_config",
]
