"""What ``powerfleet retune status`` shows per deployment: leader, mode, decisions, routers.

Read-only: it reads the two Leases, the DGD and its frontend pods, and GETs each frontend's
``/router_policy``; it never claims a Lease or writes anything.
"""

from __future__ import annotations

from typing import Any

from powerfleet.cluster.ports import ClusterError
from powerfleet.cluster.router import RouterClient
from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.actuator import read_all, same, target_for
from powerfleet.retune.context import Deployment, LeaseCluster, Ports
from powerfleet.retune.premises import frontends_of, prefill_replicas, worker_replicas
from powerfleet.retune.settings import SettingsError, configured
from powerfleet.retune.state import OUTCOME_CLASS

STATUS_SCHEMA = "powerfleet.retune.status/v1"


def _no_send(*_: Any) -> None:
    raise RuntimeError("status is read-only")


def deployment_status(cfg: RetuneConfig, cluster: LeaseCluster, router: RouterClient, name: str,
                      clock: Any, decisions: int = 5) -> dict[str, Any]:
    ports = Ports(r=None, cluster=cluster, router=router, clock=clock, identity="status",  # type: ignore[arg-type]
                  send=_no_send, sweep_consumers=lambda _dir: {})
    try:
        dep = Deployment.open(cfg, ports, name)
    except SettingsError as exc:
        return {"deployment": name, "error": str(exc)}
    lease = dep.leadership.current()
    state, corrupt = dep.store.read()
    out: dict[str, Any] = {
        "deployment": name, "enabled": dep.settings.enabled, "mode": dep.settings.mode,
        "generation": dep.settings.generation,
        "engine_profile": {"name": dep.settings.engine_profile_name,
                           "source": dep.settings.engine_profile or "built-in (fallback)"},
        "leader": None if lease is None else {"holder": lease.holder_identity, "term": lease.lease_transitions,
                                              "renewed": lease.renew_time.isoformat() if lease.renew_time else None},
        "state": None, "corrupt_state": corrupt, "decisions": [], "routers": [],
    }
    if state is not None:
        out["state"] = {"term": state.term, "mode": state.mode, "last_window": state.last_window,
                        "desired": state.desired, "desired_window": state.desired_window,
                        "rollback": state.rollback, "initial_saved": sorted(state.initial),
                        "advisory": state.advisory.model_dump() if state.advisory else None,
                        "enabled_at": state.enabled_at, "last_launched": state.last_launched,
                        "pending": [p.model_dump() for p in state.pending],
                        "outcomes": _outcome_counts(state.counts)}
        out["decisions"] = [h.model_dump() for h in state.history[-decisions:]][::-1]
    if dep.dgd_obj is None:
        out["dgd"] = "not found"
        return out
    out["dgd"] = "found"
    if dep.dgd is None:
        return out
    out["replayed_as"] = _replayed_as(dep)
    pods = cluster.list_pods(dep.dgd.namespace, label_selector=dep.dgd.pod_selector)
    frontends, _ = frontends_of(dep.dgd, pods)
    got, errors = read_all(router, frontends)
    for fe in frontends:
        row: dict[str, Any] = {"pod": fe.pod, "url": fe.url}
        if fe.pod in errors:
            row.update(converged=False, error=errors[fe.pod])
        else:
            cur = got[fe.pod]
            want = target_for(state, fe.pod) if state is not None else None
            row.update(revision=cur.revision, policy=cur.policy,
                       converged=None if want is None else same(cur.policy, want))
        out["routers"].append(row)
    return out


def _replayed_as(dep: Deployment) -> dict[str, Any]:
    """What the sweeps replay: the aggregated workers, or the prefill and decode pools with the
    prefill profile and the KV link (docs/sim.md "Disaggregated replay")."""
    assert dep.dgd is not None
    s = dep.settings
    prefill = prefill_replicas(dep.dgd)
    if prefill is None:
        return {"kind": "aggregated", "workers": worker_replicas(dep.dgd)}
    return {"kind": "disaggregated", "prefill_workers": prefill, "decode_workers": worker_replicas(dep.dgd),
            "prefill_engine_profile": {"name": s.prefill_engine_profile_name,
                                       "source": s.prefill_engine_profile or s.engine_profile or "built-in (fallback)"},
            "kv_transfer_gb_s": s.kv_transfer_gb_s}


def _outcome_counts(counts: dict[str, int]) -> dict[str, Any]:
    """Windows ended so far, per class (decided, abandoned, dropped) and per outcome."""
    by_class = {c: 0 for c in ("decided", "abandoned", "dropped", "skipped")}
    for what, n in counts.items():
        if what in OUTCOME_CLASS:
            by_class[OUTCOME_CLASS[what]] += n
    return {**by_class, "by_outcome": dict(sorted(counts.items()))}


def fleet_status(cfg: RetuneConfig, cluster: LeaseCluster, router: RouterClient, clock: Any) -> dict[str, Any]:
    rows = []
    for name in configured(cfg):
        try:
            rows.append(deployment_status(cfg, cluster, router, name, clock))
        except ClusterError as exc:  # the API server did not answer: the caller exits 1
            rows.append({"deployment": name, "error": str(exc), "cluster_error": True})
    return {"schema": STATUS_SCHEMA, "deployments": rows}
