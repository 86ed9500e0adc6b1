"""What the retune steps run against: the ports, and one deployment's read-only snapshot.

Tasks build ``Ports`` from their app (Redis, the cluster client, the router client, the clock,
a way to send tasks) and hand them to the steps in ``live``/``control``; tests build the same
ports against a real Redis, the loopback API server and loopback frontends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis

from powerfleet.clock import Clock
from powerfleet.cluster.dgd import DGD, parse_dgd
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.leases import LeasePort
from powerfleet.cluster.objects import ObjectRef, PodInfo
from powerfleet.cluster.ports import NotFound
from powerfleet.cluster.router import RouterClient
from powerfleet.config.fleet import RetuneConfig
from powerfleet.retune.actuator import read_all
from powerfleet.retune.fanin import FanIn
from powerfleet.retune.leadership import Leadership, StateStore, Term
from powerfleet.retune.metrics import EVENTS_FAILED
from powerfleet.retune.premises import LOAD_SCALING_ANNOTATION, Snapshot, frontends_of
from powerfleet.retune.settings import DeploymentSettings, dgd_overrides, resolve


class ClusterView(Protocol):
    def get_dgd_object(self, namespace: str, name: str) -> dict[str, Any]: ...

    def record_event(self, involved: ObjectRef, reason: str, message: str, *,
                     type: Literal["Normal", "Warning"] = "Normal") -> Any: ...

    def list_pods(self, namespace: str | None = None, *, label_selector: str | None = None,
                  node_name: str | None = None) -> list[PodInfo]: ...


class LeaseCluster(ClusterView, LeasePort, Protocol):
    """The cluster calls retune makes: read DGDs and pods, and read/write its own Leases."""


@dataclass
class Ports:
    r: redis.Redis
    cluster: LeaseCluster
    router: RouterClient
    clock: Clock
    identity: str  # this process's holder identity for the Leases
    send: Callable[[str, dict[str, Any], dict[str, Any]], None]  # (task name, kwargs, options)
    sweep_consumers: Callable[[str], dict[str, bool]]  # trace dir -> {sweep worker: can read it}
    stopping: Callable[[], bool] = lambda: False  # this process's stop has begun (retune.shutdown)

    @property
    def fanin(self) -> FanIn:
        return FanIn(self.r)


def load_scaling_on(dgd_obj: Mapping[str, Any]) -> bool:
    """Load-based scaling is declared on the DGD (the budget planner reads the same annotation)."""
    ann = ((dgd_obj.get("metadata") or {}).get("annotations") or {})
    return str(ann.get(LOAD_SCALING_ANNOTATION, "off")).strip().lower() in ("on", "true", "1", "enabled")


@dataclass
class Deployment:
    """One deployment's settings, Leases and state, resolved from one DGD read."""

    name: str
    settings: DeploymentSettings
    dgd_obj: dict[str, Any] | None
    dgd: DGD | None
    leadership: Leadership
    store: StateStore
    cluster: ClusterView | None = None

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event on the DGD, after the state write it reports succeeded. Best
        effort: an Event that cannot be recorded never fails the step (it is counted)."""
        meta = (self.dgd_obj or {}).get("metadata") or {}
        if self.cluster is None or not meta:
            return
        ref = ObjectRef(kind="DynamoGraphDeployment", name=self.name, namespace=self.settings.namespace,
                        api_version=str(self.dgd_obj.get("apiVersion") or "") if self.dgd_obj else "",
                        uid=str(meta.get("uid") or ""))
        try:
            self.cluster.record_event(ref, reason, message[:1024], type="Warning" if warning else "Normal")
        except Exception:  # noqa: BLE001 - Events are advisory; the decision is saved already
            EVENTS_FAILED.labels(self.name).inc()

    @classmethod
    def open(cls, cfg: RetuneConfig, ports: Ports, name: str) -> Deployment:
        """Raises ``SettingsError`` (one line) when the settings are invalid."""
        base = resolve(cfg, name)
        obj: dict[str, Any] | None
        try:
            obj = ports.cluster.get_dgd_object(base.namespace, name)
        except NotFound:
            obj = None
        dgd = None
        settings = base
        if obj is not None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            settings = resolve(cfg, name, dgd_overrides(ann))
            try:
                dgd = parse_dgd(obj)
            except DGDInputError:
                dgd = None
        lead = Leadership(ports.cluster, cfg.namespace, name, ports.identity,
                          duration_s=settings.lease_duration_s, clock=ports.clock, renew_s=settings.lease_renew_s,
                          stopping=ports.stopping)
        return cls(name, settings, obj, dgd, lead, StateStore(ports.cluster, lead), ports.cluster)

    @property
    def uid(self) -> str:
        """The DGD object's UID ("" while it does not exist): decisions are bound to it."""
        return str(((self.dgd_obj or {}).get("metadata") or {}).get("uid") or "")

    @property
    def object_generation(self) -> int | None:
        """The DGD's ``metadata.generation`` (bumped by every spec change)."""
        gen = ((self.dgd_obj or {}).get("metadata") or {}).get("generation")
        return int(gen) if isinstance(gen, int) else None

    def term_of(self, identity: str, term: int) -> Term:
        return Term(self.name, identity, term)

    def snapshot(self, ports: Ports, *, with_consumers: bool = True) -> Snapshot:
        if self.dgd is None or self.dgd_obj is None:
            return Snapshot(self.dgd_obj, None, [], [], {}, {}, {}, False)
        pods = ports.cluster.list_pods(self.dgd.namespace, label_selector=self.dgd.pod_selector)
        frontends, missing = frontends_of(self.dgd, pods)
        states, errors = read_all(ports.router, frontends)
        return Snapshot(
            dgd_obj=self.dgd_obj, dgd=self.dgd, frontends=frontends, frontends_without_url=missing,
            frontend_policies={p: s.policy for p, s in states.items()}, frontend_errors=errors,
            sweep_consumers=ports.sweep_consumers(self.settings.trace_dir) if with_consumers else {},
            load_scaling=load_scaling_on(self.dgd_obj),
        )
