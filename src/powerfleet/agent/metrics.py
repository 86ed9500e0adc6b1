"""The agent's Prometheus metrics (``powerfleet_agent_*``), one object per agent.

Each ``AgentMetrics`` owns its registry (the default one in the agent process, a fresh one
in tests), so two agents in one test process never collide.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = REGISTRY if registry is None else registry
        self.registry = r
        p = "powerfleet_agent_"
        self.applied_limit = Gauge(p + "applied_limit_watts", "Power limit in force per GPU after the last pass",
                                   ["gpu"], registry=r)
        self.draw = Gauge(p + "power_draw_watts", "Measured power draw per GPU at the last pass", ["gpu"], registry=r)
        self.multi_pod = Counter(p + "multi_pod_gpu_total", "GPUs shared by several opted-in pods, by disposition",
                                 ["disposition"], registry=r)
        self.safe_default = Counter(p + "safe_default_applied_total",
                                    "Caps that fell back to agent.safe_default_watts", registry=r)
        self.clamped = Counter(p + "cap_clamped_total", "Requested caps clamped to the device range, by bound",
                               ["direction"], registry=r)
        self.apply_failures = Counter(p + "apply_failures_total", "GPU reads, sets or read-backs that failed",
                                      registry=r)
        self.pod_list_failures = Counter(p + "pod_list_failures_total",
                                         "Passes skipped because the node's pods could not be listed", registry=r)
        self.passes = Counter(p + "passes_total", "Passes by trigger and outcome", ["trigger", "outcome"], registry=r)
        self.pass_duration = Histogram(p + "pass_duration_seconds", "Time one pass took", registry=r,
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.last_good_pass = Gauge(p + "last_good_pass_timestamp_seconds", "Epoch time of the last good pass",
                                    registry=r)
        self.last_good_pass_age = Gauge(p + "last_good_pass_age_seconds",
                                        "Seconds since the last good pass (-1 before the first)", registry=r)
        self.refused = Counter(p + "refused_tasks_total", "Node tasks refused because they name another node",
                               ["reason"], registry=r)
        self.binding_restores = Counter(p + "binding_restores_total",
                                        "Times the agent found its queue binding changed and restored it", registry=r)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when absent); for tests and the CLI."""
        got = self.registry.get_sample_value(name, labels or {})
        return 0.0 if got is None else got
