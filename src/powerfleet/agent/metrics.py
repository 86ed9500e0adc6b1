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

        # Per GPU with dcgm-exporter's label names, so a panel can plot DCGM_FI_DEV_POWER_USAGE
        # against them by joining on UUID; namespace/pod/container are empty when unmapped.
        gl = ["gpu", "UUID", "Hostname", "namespace", "pod", "container"]
        self.requested = Gauge(p + "gpu_power_limit_requested_watts", "Cap the GPU's pods ask for", gl, registry=r)
        self.target = Gauge(p + "gpu_power_limit_target_watts", "The requested cap clamped into the card's range",
                            gl, registry=r)
        self.enforced = Gauge(p + "gpu_power_limit_enforced_watts",
                              "Enforced limit read back from the GPU after all limiters (nvmlDeviceGetEnforcedPowerLimit)",
                              gl, registry=r)
        self.readback_time = Gauge(p + "gpu_power_limit_readback_timestamp_seconds",
                                   "Epoch time of the last successful readback (age: time() - this)", gl, registry=r)
        dl = ["gpu", "UUID", "Hostname"]
        self.unsupported = Gauge(p + "gpu_power_limit_unsupported", "1 for a GPU without power-limit support "
                                 "(left out of readiness)", dl, registry=r)
        self.persistence = Gauge(p + "gpu_persistence_mode", "1 when the GPU's persistence mode is on, 0 when off "
                                 "(off: a limit may not survive the driver unloading once no client holds it)",
                                 dl, registry=r)
        self.unattributed = Gauge(p + "gpu_unattributed_processes", "Processes on the GPU the agent cannot map to a "
                                  "pod it sees (its cap is kept)", dl, registry=r)
        self.gpu_errors = Counter(p + "gpu_errors_total", "GPU calls that failed, by kind", ["kind"], registry=r)
        self.readback_mismatch = Counter(p + "readback_mismatch_total", "Limits found different from the target this "
                                         "agent set (an external nvidia-smi -pl or a reset), re-applied", registry=r)
        self.enforced_below = Counter(p + "enforced_below_target_total", "Passes where the enforced limit was below "
                                      "the target (an out-of-band or BMC limit)", registry=r)
        self.podresources_mismatch = Counter(p + "podresources_mismatch_total", "GPUs whose processes belong to "
                                             "no pod the kubelet allocated them to (PodResources cross-check)",
                                             registry=r)
        self.excluded = Gauge(p + "gpu_excluded", "1 for a GPU left out of readiness after failing passes "
                              "(retried every pass), by kind of failure", ["gpu", "UUID", "Hostname", "kind"],
                              registry=r)
        self.podresources_refused = Counter(p + "podresources_refused_ids_total", "Device IDs in the kubelet's "
                                            "allocations the agent cannot map to a GPU (neither UUID nor index)",
                                            registry=r)
        self.state_write_failures = Counter(p + "state_write_failures_total", "Saves of the state record that "
                                            "failed (a write-ahead failure refuses that GPU's new cap)", registry=r)
        self._series: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # uuid -> (gpu labels, device labels)

    def gpu_labels(self, uuid: str, gl: tuple[str, ...], dl: tuple[str, ...]) -> None:
        """Remember a GPU's label sets; the series of its old labels go when they change."""
        old = self._series.get(uuid)
        if old is not None and old != (gl, dl):
            self._remove(old)
        self._series[uuid] = (gl, dl)

    def supported(self, dl: tuple[str, ...]) -> None:
        """A GPU that reads again: its `unsupported` series goes."""
        try:
            self.unsupported.remove(*dl)
        except KeyError:
            pass

    def series_labels(self, uuid: str) -> tuple[str, ...] | None:
        got = self._series.get(uuid)
        return None if got is None else got[0]

    def retire_gpus(self, present: set[str]) -> None:
        """Remove the series of GPUs no longer on the node (after a complete scan)."""
        indexes = {self._series[u][1][0] for u in present if u in self._series}
        for uuid in [u for u in self._series if u not in present]:
            gone = self._series.pop(uuid)
            self._remove(gone)
            if gone[1][0] not in indexes:
                self.retire_index(gone[1][0])

    def _remove(self, labels: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
        gl, dl = labels
        for g in (self.requested, self.target, self.enforced, self.readback_time):
            try:
                g.remove(*gl)
            except KeyError:
                pass
        for g in (self.unsupported, self.unattributed, self.persistence):
            try:
                g.remove(*dl)
            except KeyError:
                pass

    def retire_index(self, index: str) -> None:
        """The index-only series of a GPU index no longer on the node."""
        for g in (self.applied_limit, self.draw):
            try:
                g.remove(index)
            except KeyError:
                pass

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when absent); for tests and the CLI."""
        got = self.registry.get_sample_value(name, labels or {})
        return 0.0 if got is None else got
