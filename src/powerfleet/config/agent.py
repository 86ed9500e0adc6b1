"""The node agent's settings (docs/agent.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from powerfleet.config.base import NAMESPACE, Strict


class AgentConfig(Strict):
    """The node agent (docs/agent.md). The node name comes from ``agent --node``."""

    # Cap for a GPU whose pods give no valid cap (an invalid or missing annotation on a pod sharing
    # it): safe_default_fraction of the card's maximum; safe_default_watts overrides when set,
    # clamped into the card's range, and is ignored where it would be at or above the maximum.
    safe_default_fraction: float = Field(0.7, gt=0, lt=1)
    safe_default_watts: int | None = Field(None, ge=1, le=100_000)
    state_dir: str = "/var/lib/powerfleet-agent"  # managed_gpus.json; a hostPath in the chart
    proc_root: str = "/proc"  # the host's /proc (hostPID, or mounted read-only)
    namespaces: list[str] = Field(default_factory=list)  # pods listed/watched here only; empty: all
    gpu_backend: Literal["nvml", "simulated"] = "nvml"
    simulated_dir: str | None = None  # simulated backend: <dir>/<node>.json, shared with the twin
    kubeconfig: str | None = None  # None: the in-cluster service account
    watch: bool = True  # run a pass as soon as an annotated pod on the node changes
    # The kubelet's PodResources socket ({node}: the node's name); absent: map GPUs by process only.
    podresources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    # Write Dynamo's enforcement report annotation on annotated pods (pods get + patch; the chart guards it).
    enforcement_annotation: bool = True
    # Between passes, read the GPUs' process lists this often; a change runs a pass (0: off).
    process_poll_s: float = Field(1.0, ge=0, le=60)
    probe_port: int = Field(0, ge=0, le=65535)  # /readyz and /metrics; 0 disables (the chart sets 8081)
    probe_address: str = "127.0.0.1"
    # Drains (agent/drain.py): a node is drained only if it has, or had this recently, an agent
    # (else `drain --force`); every drain order expires, after drain_ttl_s unless --ttl says (at most drain_max_ttl_s).
    drain_retention_s: float = Field(7 * 86400.0, ge=0, le=366 * 86400.0, allow_inf_nan=False)
    drain_ttl_s: float = Field(7 * 86400.0, ge=1, le=366 * 86400.0, allow_inf_nan=False)
    drain_max_ttl_s: float = Field(30 * 86400.0, ge=1, le=366 * 86400.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _drain_ttl_within_max(self) -> "AgentConfig":
        if self.drain_ttl_s > self.drain_max_ttl_s:
            raise ValueError(f"drain_ttl_s ({self.drain_ttl_s:g}) is above drain_max_ttl_s ({self.drain_max_ttl_s:g})")
        return self

    @field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, v: list[str]) -> list[str]:
        for ns in v:
            if not NAMESPACE.match(ns):
                raise ValueError(f"{ns!r} is not a valid namespace name")
        return v

    @model_validator(mode="after")
    def _simulated_needs_dir(self) -> "AgentConfig":
        if self.gpu_backend == "simulated" and not self.simulated_dir:
            raise ValueError("gpu_backend 'simulated' needs simulated_dir")
        return self
