"""Premise checks before a retune window launches: each failure has a stable code.

The checks are pure: the caller reads a snapshot (the DGD object, its frontend pods and their
current router settings, who consumes ``sweep``) and this module says whether a window may
launch. Codes (docs/retune.md lists them with the fix for each):

``settings-invalid``, ``dgd-missing``, ``dgd-unsettled``, ``no-frontend``,
``frontend-unreachable``, ``worker-router-override``, ``credit-zero-frontend``,
``trace-dir-unreadable``, ``time-budget``, ``load-scaling-on``, ``no-sweep-consumer``,
``sweep-cannot-read``, ``disaggregated`` (a shape of pools the simulator does not model; one
prefill and one decode pool are replayed as such, sim/disagg.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerfleet.cluster.dgd import DGD, LABEL_COMPONENT, LABEL_DGD_NAME, ComponentType, RolloutPhase
from powerfleet.cluster.objects import PodInfo
from powerfleet.retune.settings import DeploymentSettings

ROUTER_URL_ANNOTATION = "powerfleet.nvidia.com/router-url"
LOAD_SCALING_ANNOTATION = "powerfleet.nvidia.com/load-scaling"
# A worker that advertises its own router configuration replaces the frontend's for its
# requests, so a sweep of the frontend's settings would not describe what serves traffic.
_ROUTER_ENV = ("DYN_ROUTER_", "DYN_KV_ROUTER")
_ROUTER_ARGS = ("--router-", "--kv-overlap-score", "--router-temperature")


@dataclass(frozen=True)
class Premise:
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class Frontend:
    pod: str
    url: str


def frontends_of(dgd: DGD, pods: Sequence[PodInfo]) -> tuple[list[Frontend], list[str]]:
    """(frontends with a router URL, pod names lacking one); only live pods of frontend components."""
    names = {c.name for c in dgd.components if c.type is ComponentType.FRONTEND}
    found, missing = [], []
    for p in sorted(pods, key=lambda p: p.name):
        if p.namespace != dgd.namespace or p.labels.get(LABEL_DGD_NAME) != dgd.name:
            continue
        if p.labels.get(LABEL_COMPONENT) not in names or p.terminating or p.phase != "Running":
            continue
        url = p.annotations.get(ROUTER_URL_ANNOTATION)
        if url and url.startswith(("http://", "https://")):
            found.append(Frontend(p.name, url))
        else:
            missing.append(p.name)
    return found, missing


def _role(c: Any) -> ComponentType | None:
    """A component's role: its ``subComponentType`` when that names a pool, else its type."""
    return c.sub_type if c.sub_type in (ComponentType.PREFILL, ComponentType.DECODE) else c.type


def _replicas(dgd: DGD, role: ComponentType) -> int:
    return sum(c.replicas for c in dgd.components if _role(c) is role)


def worker_replicas(dgd: DGD) -> int:
    """Replicas the sweep replays: the aggregated workers, else the decode pool."""
    return _replicas(dgd, ComponentType.WORKER) or _replicas(dgd, ComponentType.DECODE)


def prefill_replicas(dgd: DGD) -> int | None:
    """A disaggregated deployment's prefill pool (its decode pool is ``worker_replicas``);
    None for aggregated workers."""
    return _replicas(dgd, ComponentType.PREFILL) if disaggregated_pools(dgd) else None


def disaggregated_pools(dgd: DGD) -> list[str]:
    """The prefill/decode pools of a disaggregated deployment (empty: aggregated)."""
    kinds = {ComponentType.PREFILL, ComponentType.DECODE}
    found = {k.value for c in dgd.components for k in (c.type, c.sub_type) if k in kinds}
    return sorted(found)


def unmodelled_shape(dgd: DGD) -> str | None:
    """Why the simulator cannot replay this deployment's workers, if it cannot: the
    disaggregated model needs exactly one prefill and one decode pool, and no aggregated
    workers beside them."""
    pools = disaggregated_pools(dgd)
    if not pools:
        return None
    if pools != ["decode", "prefill"]:
        return f"a {pools[0]} pool without a {'decode' if pools[0] == 'prefill' else 'prefill'} pool"
    if any(_role(c) is ComponentType.WORKER for c in dgd.components):
        return "aggregated workers beside the prefill and decode pools"
    return None


def unsettled_reasons(dgd: DGD) -> list[str]:
    st = dgd.status
    out = []
    if dgd.generation is not None and st.observed_generation != dgd.generation:
        out.append(f"observedGeneration {st.observed_generation} behind generation {dgd.generation}")
    if st.rollout in (RolloutPhase.PENDING, RolloutPhase.IN_PROGRESS, RolloutPhase.FAILED):
        out.append(f"rollout {st.rollout.value}")
    for c in dgd.components:
        cs = st.components.get(c.name)
        if cs is not None and cs.ready_replicas is not None and cs.ready_replicas != c.replicas:
            out.append(f"component {c.name!r}: {cs.ready_replicas} of {c.replicas} replicas ready")
    return out


def _strings(node: Any, key: str) -> Iterator[str]:
    """Every string under a key named ``key`` anywhere below ``node`` (env names, args)."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            if k == key:
                if isinstance(v, list):
                    for item in v:
                        if isinstance(item, str):
                            yield item
                        elif isinstance(item, Mapping) and isinstance(item.get("name"), str):
                            yield item["name"]
            yield from _strings(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)


def router_overrides(dgd_obj: Mapping[str, Any], dgd: DGD) -> list[str]:
    """Non-frontend components that set router options on their own (env or args)."""
    spec = dgd_obj.get("spec") or {}
    raw: list[tuple[str, Any]] = []
    if isinstance(spec.get("components"), list):
        raw = [(str(c.get("name")), c) for c in spec["components"] if isinstance(c, Mapping)]
    elif isinstance(spec.get("services"), Mapping):
        raw = list(spec["services"].items())
    frontends = {c.name for c in dgd.components if c.type is ComponentType.FRONTEND}
    out = []
    for name, body in raw:
        if name in frontends:
            continue
        envs = [e for e in _strings(body, "env") if e.startswith(_ROUTER_ENV)]
        args = [a for k in ("args", "command") for a in _strings(body, k) if a.startswith(_ROUTER_ARGS)]
        if envs or args:
            out.append(f"{name} ({', '.join(envs + args)})")
    return out


@dataclass(frozen=True)
class Snapshot:
    """What the window step read, for the premises."""

    dgd_obj: Mapping[str, Any] | None
    dgd: DGD | None
    frontends: list[Frontend]
    frontends_without_url: list[str]
    frontend_policies: dict[str, dict[str, float]]  # pod -> current settings (readable ones)
    frontend_errors: dict[str, str]
    sweep_consumers: dict[str, bool]  # worker consuming ``sweep`` -> can it read the trace directory
    load_scaling: bool


def check(s: DeploymentSettings, snap: Snapshot,
          initial: Mapping[str, Mapping[str, float]] | None = None) -> list[Premise]:
    """Every premise that fails (empty: the window may launch).

    ``initial``: each frontend's settings saved before retune first wrote to it. A credit of 0
    is the operator's choice only there: a 0 that retune itself decided must not block it.
    """
    out: list[Premise] = []
    if snap.dgd is None or snap.dgd_obj is None:
        return [Premise("dgd-missing", f"deployment {s.namespace}/{s.dgd} does not exist")]
    if shape := unmodelled_shape(snap.dgd):
        out.append(Premise("disaggregated", f"{shape}: the simulator replays aggregated workers or one prefill "
                           "and one decode pool, so a sweep would not describe this deployment's routing"))
    elif disaggregated_pools(snap.dgd) and s.kv_bytes_per_token is None:
        out.append(Premise("disaggregated", f"the engine profiles ({s.prefill_engine_profile_name}, "
                           f"{s.engine_profile_name}) give no kv_bytes_per_token, which the KV transfer between "
                           "the prefill and decode pools needs; add it to the profile file"))
    if reasons := unsettled_reasons(snap.dgd):
        out.append(Premise("dgd-unsettled", "; ".join(reasons)))
    if not snap.frontends:
        extra = f" ({len(snap.frontends_without_url)} without {ROUTER_URL_ANNOTATION})" if snap.frontends_without_url else ""
        out.append(Premise("no-frontend", f"no running frontend with a router URL{extra}"))
    if snap.frontend_errors:
        first = sorted(snap.frontend_errors.items())[0]
        out.append(Premise("frontend-unreachable", f"{len(snap.frontend_errors)} frontend(s) unreadable, "
                                                   f"e.g. {first[0]}: {first[1]}"))
    if over := router_overrides(snap.dgd_obj, snap.dgd):
        out.append(Premise("worker-router-override", "workers set their own router options: " + "; ".join(over)))
    initial = initial or {}
    zero = sorted(p for p, pol in snap.frontend_policies.items()
                  if initial.get(p, pol).get("overlap_score_credit") == 0)
    if zero and s.searched_credit_positive():
        out.append(Premise("credit-zero-frontend", f"frontend(s) {', '.join(zero)} run overlap_score_credit 0, "
                                                   "which a live router keeps at 0; drop positive credits from the grid"))
    if not (os.path.isdir(s.trace_dir) and os.access(s.trace_dir, os.R_OK | os.W_OK | os.X_OK)):
        out.append(Premise("trace-dir-unreadable", f"trace directory {s.trace_dir!r} is not a readable, writable directory"))
    if s.time_budget_s <= s.shard_timeout_s or s.time_budget_s >= s.interval_s:
        out.append(Premise("time-budget", f"time budget {s.time_budget_s:g}s must exceed the shard timeout "
                                          f"{s.shard_timeout_s:g}s and stay under the interval {s.interval_s}s"))
    if snap.load_scaling:
        out.append(Premise("load-scaling-on", "load-based scaling is on for this deployment; replicas must stay "
                                              f"fixed while retune runs (set {LOAD_SCALING_ANNOTATION}: off)"))
    if not snap.sweep_consumers:
        out.append(Premise("no-sweep-consumer", "no worker consumes the sweep queue"))
    elif s.window_store == "file" and not any(snap.sweep_consumers.values()):
        out.append(Premise("sweep-cannot-read", f"no sweep worker ({', '.join(sorted(snap.sweep_consumers))}) can read "
                                                f"the trace directory {s.trace_dir!r}; mount the trace volume there"))
    if worker_replicas(snap.dgd) < 1:
        out.append(Premise("dgd-unsettled", "the deployment has no worker replicas to replay"))
    elif prefill_replicas(snap.dgd) == 0:
        out.append(Premise("dgd-unsettled", "the deployment's prefill pool has no replicas to replay"))
    return out
