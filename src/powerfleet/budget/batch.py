"""A tick's evaluations in batches that share one snapshot of the cluster (issue 30 item 4).

One evaluation alone reads its DGD, its status ConfigMap, its pods and its namespace's scaling
adapters: four calls per deployment, ten with its writes. A batch reads them once for all its
deployments: one LIST of the DGDs, one of the status ConfigMaps (by label), the DGD pods (one
label-selected LIST, in pages) and the scaling adapters once per namespace; then each deployment
is evaluated by the same ``evaluate_deployment`` (budget/runner.py) on that snapshot, so only its
writes reach the API server, and only where something changed: a deployment that does not change
costs no call. Its writes stay fenced on the versions in the snapshot (a change since is a
conflict, re-planned at the next tick), and each deployment's allowance and generation are
checked in Redis when its turn comes (budget/generations.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from powerfleet.budget.evidence import EnforcementReports
from powerfleet.budget.state import OTHER_WRITER, ROLLING, BudgetState
from powerfleet.cluster.immutability import AdmittedPowerInputs
from powerfleet.budget.persist import ConfigMapStatus
from powerfleet.cluster.budget_store import LABEL_FOR, LABEL_MANAGED_BY, KubeBudgetStore, StoredStatus, stored_status
from powerfleet.cluster.dgd import DGD_GROUP, DGD_PLURAL, LABEL_DGD_NAME
from powerfleet.cluster.gpu_pods import GpuPod, KubeGpuPods
from powerfleet.cluster.kube import LIST_TIMEOUT_SECONDS, REQUEST_TIMEOUT_SECONDS, KubeCluster, _api_errors
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import NotFound
from powerfleet.cluster.retries import with_retries
from powerfleet.cluster.scaling import KubeScaling, ScalingAdapter
from powerfleet.heap import paused_gc

Key = tuple[str, str]  # (namespace, DGD name)


class PodSource(Protocol):
    """``KubeGpuPods`` or the watch-backed view (cluster/gpu_pod_cache.py)."""

    def list_gpu_pods(self, label_selector: str | None = None) -> list[GpuPod]: ...


@dataclass
class ClusterSnapshot:
    dgds: dict[Key, dict[str, Any]]  # the DGDs as served
    statuses: dict[Key, StoredStatus]  # each DGD's status ConfigMap, by the DGD it is for
    pods: dict[Key, list[PodInfo]]  # each DGD's pods
    adapters: dict[str, list[ScalingAdapter]]  # namespace -> its scaling adapters


def _key(deployment: str) -> Key:
    ns, _, name = deployment.partition("/")
    return ns, name


@paused_gc()  # the bulk reads' objects: src/powerfleet/heap.py
def read_snapshot(kube: KubeCluster, scaling: KubeScaling, deployments: Iterable[str],
                  pods: PodSource | None = None) -> ClusterSnapshot:
    """The cluster as a batch of ``deployments`` sees it, in a handful of LISTs. Raises ClusterError."""
    namespaces = sorted({_key(d)[0] for d in deployments})
    version = kube.dgd_version()
    with _api_errors("list DGDs (all namespaces, for the batch)"):
        raw = with_retries(lambda: kube.custom.list_cluster_custom_object(
            DGD_GROUP, version, DGD_PLURAL, timeout_seconds=LIST_TIMEOUT_SECONDS, _request_timeout=REQUEST_TIMEOUT_SECONDS))
    dgds = {(str(m.get("namespace") or ""), str(m.get("name") or "")): item for item in raw.get("items") or []
            if isinstance(item, Mapping) and isinstance(m := item.get("metadata"), Mapping)}
    store = KubeBudgetStore(kube)
    with _api_errors("list budget status ConfigMaps (all namespaces)"):
        resp = with_retries(lambda: store.core.list_config_map_for_all_namespaces(
            label_selector=f"{LABEL_MANAGED_BY}=powerfleet,{LABEL_FOR}", timeout_seconds=LIST_TIMEOUT_SECONDS,
            _request_timeout=REQUEST_TIMEOUT_SECONDS, _preload_content=False))
    statuses: dict[Key, StoredStatus] = {}
    for cm in json.loads(resp.data).get("items") or []:
        meta = cm.get("metadata") or {}
        statuses[(str(meta.get("namespace") or ""), str((meta.get("labels") or {}).get(LABEL_FOR) or ""))] = \
            stored_status(cm)
    reader = pods if pods is not None else KubeGpuPods(kube)
    by_dgd: dict[Key, list[PodInfo]] = defaultdict(list)
    for p in reader.list_gpu_pods(label_selector=LABEL_DGD_NAME):
        by_dgd[(p.namespace, p.labels.get(LABEL_DGD_NAME, ""))].append(p)
    adapters = {ns: scaling.list_scaling_adapters(ns) for ns in namespaces}
    return ClusterSnapshot(dgds, statuses, dict(by_dgd), adapters)


class SnapshotCluster:
    """The cluster as ``evaluate_deployment`` uses it, with its reads answered from the snapshot;
    every write (and anything else) goes to the real cluster."""

    def __init__(self, cluster: KubeCluster, snap: ClusterSnapshot) -> None:
        self._cluster, self._snap = cluster, snap

    def get_dgd_object(self, namespace: str, name: str) -> dict[str, Any]:
        obj = self._snap.dgds.get((namespace, name))
        if obj is None:
            raise NotFound(f"get DGD {namespace}/{name}: not in the batch's snapshot", status=404)
        return obj

    def list_pods(self, namespace: str | None = None, *, label_selector: str | None = None,
                  node_name: str | None = None) -> list[PodInfo]:
        prefix = f"{LABEL_DGD_NAME}="
        if namespace is None or node_name or not label_selector or not label_selector.startswith(prefix) \
                or "," in label_selector:
            return self._cluster.list_pods(namespace, label_selector=label_selector, node_name=node_name)
        return list(self._snap.pods.get((namespace, label_selector[len(prefix):]), []))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


class SnapshotStatus(ConfigMapStatus):
    """The status ConfigMaps, their previous contents read from the snapshot."""

    def __init__(self, store: KubeBudgetStore, snap: ClusterSnapshot) -> None:
        super().__init__(store)
        self._snap = snap

    def _read(self, namespace: str, dgd_name: str) -> StoredStatus | None:
        return self._snap.statuses.get((namespace, dgd_name))


class SnapshotScaling:
    """The scaling adapters, listed once per namespace for the batch; writes go to the cluster."""

    def __init__(self, scaling: KubeScaling, snap: ClusterSnapshot) -> None:
        self._scaling, self._snap = scaling, snap

    def list_scaling_adapters(self, namespace: str) -> list[ScalingAdapter]:
        if namespace in self._snap.adapters:
            return list(self._snap.adapters[namespace])
        return self._scaling.list_scaling_adapters(namespace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scaling, name)


class BatchState:
    """The budget state (budget/state.py) as a batch's evaluations use it: proposals, admissions,
    other-writer notes, rolling flags and figures read once for the batch (a handful of pipelined
    reads instead of about ten round trips per deployment), and a write skipped where it would
    store what is there already. The replica counts (their broker-epoch check) and every write
    that changes something go to Redis at once, as in a single evaluation."""

    def __init__(self, state: BudgetState, client: redis.Redis) -> None:
        self._state = state
        with client.pipeline(transaction=False) as p:
            p.hgetall(OTHER_WRITER)
            p.smembers(ROLLING)
            writers, rolling = p.execute()
        self._proposals, self._admitted, self._figures = state.proposals(), state.all_admitted(), state.figures()
        self._writers = {k.decode(): v.decode() for k, v in writers.items()}
        self._rolling = {m.decode() for m in rolling}
        self._replicas: dict[str, dict[str, int] | None] = {}

    def proposal(self, key: str) -> dict[str, int] | None:
        return self._proposals.get(key)

    def admitted(self, key: str) -> AdmittedPowerInputs | None:
        return self._admitted.get(key)

    def admit(self, key: str, record: AdmittedPowerInputs) -> None:
        if self._admitted.get(key) != record:
            self._state.admit(key, record)
            self._admitted[key] = record

    def other_writer(self, key: str) -> str | None:
        return self._writers.get(key)

    def flag_other_writer(self, key: str, why: str) -> None:
        self._state.flag_other_writer(key, why)
        self._writers[key] = why

    def was_rolling(self, key: str) -> bool:
        return key in self._rolling

    def set_rolling(self, key: str, rolling: bool) -> None:
        if rolling != (key in self._rolling):
            self._state.set_rolling(key, rolling)
            (self._rolling.add if rolling else self._rolling.discard)(key)

    def last_replicas(self, key: str) -> dict[str, int] | None:
        self._replicas[key] = got = self._state.last_replicas(key)
        return got

    def record_replicas(self, key: str, counts: Mapping[str, int]) -> None:
        if self._replicas.get(key) != dict(counts):  # the record read (same epoch) holds them already
            self._state.record_replicas(key, counts)

    def record_figures(self, key: str, figures: Mapping[str, Any]) -> None:
        if self._figures.get(key) != json.loads(json.dumps(dict(figures))):
            self._state.record_figures(key, figures)


class PrefetchedReports:
    """The agents' enforcement reports of every node the batch's pods run on, read once."""

    def __init__(self, reports: EnforcementReports, nodes: Iterable[str]) -> None:
        self._got = reports.reports(sorted(set(nodes)))

    def reports(self, nodes: Iterable[str]) -> dict[str, list[Any]]:
        return {n: self._got[n] for n in nodes if n in self._got}
