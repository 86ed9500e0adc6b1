"""The twin operator's one writer: reads a snapshot and persists a ``Plan`` through the official client.

``OperatorLoop.run_once`` lists DGDs, pods and nodes (the read side), calls the pure
``operator.reconcile`` and writes the result: pod deletes, creates, bindings and status
steps, then each DGD's status once, skipped when unchanged. Deletes are graceful (the API
server keeps the pod Terminating for its grace period); the plan's removals, pods past their
deadline, are deleted with a grace period of 0 (the kubelet's final delete). Events follow the contract:
a pod event only after that pod's create/delete succeeded; a DGD's status-transition events
only after its status write succeeded and changed the stored object.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from powerfleet.clock import Clock, SystemClock
from powerfleet.cluster.dgd import DGD_GROUP, DGD_PLURAL, DGD_VERSION
from powerfleet.twin.fidelity import OperatorSettings
from powerfleet.twin.cluster.operator import GPUS_ANNOTATION, Event, Plan, reconcile
from powerfleet.twin.cluster.scheduler import NodeView, node_view
from powerfleet.twin.cluster.other_writers import OtherWriters, OtherWrites
from powerfleet.twin.cluster.planner import StandInPlanner

log = logging.getLogger(__name__)
_TIMEOUT = 10.0


@dataclass
class PassResult:
    created: int = 0
    deleted: int = 0
    stepped: int = 0
    status_writes: int = 0
    events: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class OperatorLoop:
    """Reconciles every DGD in one namespace, one pass per ``interval_s`` (or ``run_once`` by hand)."""

    def __init__(self, kubeconfig: str, namespace: str = "default", *, clock: Clock | None = None,
                 dgd_version: str = DGD_VERSION, settings: OperatorSettings | None = None,
                 planner: StandInPlanner | None = None) -> None:
        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.namespace = namespace
        self.clock = clock or SystemClock()
        self.dgd_version = dgd_version
        self.settings = settings or OperatorSettings()
        # Dynamo's scaling adapter controller and (optionally) a stand-in planner: other writers
        # of replicas, run before each pass reads its snapshot.
        self.others = OtherWriters(self.custom, namespace, dgd_version, planner)
        self.last_other_writes: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.last_error: str | None = None

    # -- the read side --

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[NodeView]]:
        dgds = self.custom.list_namespaced_custom_object(DGD_GROUP, self.dgd_version, self.namespace, DGD_PLURAL,
                                                         _request_timeout=_TIMEOUT)["items"]
        san = self.api_client.sanitize_for_serialization
        pods = [san(p) for p in self.core.list_namespaced_pod(self.namespace, _request_timeout=_TIMEOUT).items]
        # What the scheduler reads of each node: labels, taints, cordon, allocatable GPUs (twin/cluster/scheduler.py).
        nodes = sorted((node_view(san(n)) for n in self.core.list_node(_request_timeout=_TIMEOUT).items),
                       key=lambda v: v.name)
        return dgds, pods, nodes

    # -- the one writer --

    def run_once(self) -> PassResult:
        try:
            others = self.others.run(self.clock.now())
        except ApiException as exc:  # another controller failing must not stop this one's pass
            others = OtherWrites(errors=[f"other writers: HTTP {exc.status}"])
        self.last_other_writes = others.dgd_replica_writes
        dgds, pods, nodes = self.snapshot()
        plan = reconcile(dgds, pods, nodes, now=self.clock.now(), settings=self.settings)
        result = self.write(plan, {d["metadata"]["name"]: d for d in dgds})
        result.errors[:0] = others.errors
        self.passes += 1
        return result

    def write(self, plan: Plan, dgds: Mapping[str, Mapping[str, Any]]) -> PassResult:
        out = PassResult()
        ns = self.namespace
        for name in plan.removals:
            try:
                self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0, _request_timeout=_TIMEOUT)
            except ApiException as exc:
                if exc.status != 404:
                    out.errors.append(f"remove pod {name}: HTTP {exc.status}")
        for name in plan.deletes:
            try:
                self.core.delete_namespaced_pod(name, ns, _request_timeout=_TIMEOUT)
            except ApiException as exc:
                if exc.status != 404:
                    out.errors.append(f"delete pod {name}: HTTP {exc.status}")
                continue
            out.deleted += 1
            self._event(out, Event("Pod", name, "Killing", f"deleted pod {name}"))
        for pod in plan.creates:
            name = pod["metadata"]["name"]
            try:
                self.core.create_namespaced_pod(ns, pod, _request_timeout=_TIMEOUT)
                # The API server starts every new pod Pending with no conditions; the scheduling
                # outcome is the scheduler's status write.
                self.core.patch_namespaced_pod_status(name, ns, {"status": pod["status"]}, _request_timeout=_TIMEOUT)
            except ApiException as exc:
                out.errors.append(f"create pod {name}: HTTP {exc.status}")
                continue
            out.created += 1
            where = pod["spec"].get("nodeName") or "nowhere (unschedulable)"
            self._event(out, Event("Pod", name, "Scheduled", f"assigned {ns}/{name} to {where}"))
        for name, (node, gpus) in plan.placements.items():
            # The GPUs first (a pod's metadata is the client's), then the node through pods/binding, as a
            # scheduler binds: a real server refuses a change of spec.nodeName (422); the binding sets
            # PodScheduled True.
            body = {"metadata": {"annotations": {GPUS_ANNOTATION: ",".join(map(str, gpus))}}}
            binding = client.V1Binding(metadata=client.V1ObjectMeta(name=name),
                                       target=client.V1ObjectReference(kind="Node", name=node))
            try:
                self.core.patch_namespaced_pod(name, ns, body, _request_timeout=_TIMEOUT)
                # Unparsed: the server answers a Status, which the client's V1Binding model refuses.
                self.core.create_namespaced_pod_binding(name, ns, binding, _request_timeout=_TIMEOUT,
                                                        _preload_content=False).release_conn()
            except ApiException as exc:
                out.errors.append(f"bind pod {name}: HTTP {exc.status}")
                continue
            self._event(out, Event("Pod", name, "Scheduled", f"assigned {ns}/{name} to {node}"))
        for name, status in plan.pod_status.items():
            try:
                self.core.patch_namespaced_pod_status(name, ns, {"status": status}, _request_timeout=_TIMEOUT)
                out.stepped += 1
            except ApiException as exc:
                out.errors.append(f"pod status {name}: HTTP {exc.status}")
        for name, status in plan.dgd_status.items():
            current = dgds.get(name) or {}
            if current.get("status") == status:
                continue  # unchanged: no write, no event
            before = str(current.get("metadata", {}).get("resourceVersion", ""))
            try:
                # A full replacement of the status subresource: the program's status is authoritative.
                body = {"apiVersion": current.get("apiVersion"), "kind": current.get("kind"),
                        "metadata": {"name": name, "namespace": ns, "resourceVersion": before}, "status": status}
                written = self.custom.replace_namespaced_custom_object_status(
                    DGD_GROUP, self.dgd_version, ns, DGD_PLURAL, name, body, _request_timeout=_TIMEOUT)
            except ApiException as exc:
                # 409: someone changed the DGD since our snapshot; the next pass recomputes.
                out.errors.append(f"status {name}: HTTP {exc.status}")
                continue
            out.status_writes += 1
            if str(written.get("metadata", {}).get("resourceVersion", "")) != before:
                for ev in plan.status_events.get(name, []):
                    self._event(out, ev)
        if out.errors:
            self.last_error = out.errors[-1]
        return out

    def _event(self, out: PassResult, ev: Event) -> None:
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        api_version = "v1" if ev.kind == "Pod" else f"{DGD_GROUP}/{self.dgd_version}"
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{ev.name}.", namespace=self.namespace),
            involved_object=client.V1ObjectReference(kind=ev.kind, name=ev.name, namespace=self.namespace,
                                                     api_version=api_version),
            reason=ev.reason, message=ev.message, type=ev.type, first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component="twin-operator"),
        )
        try:
            self.core.create_namespaced_event(self.namespace, body, _request_timeout=_TIMEOUT)
            out.events.append(f"{ev.kind}/{ev.name} {ev.reason}")
        except ApiException as exc:
            out.errors.append(f"event {ev.reason} on {ev.name}: HTTP {exc.status}")

    # -- background --

    def start(self, interval_s: float = 1.0) -> OperatorLoop:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.run_once()
                except Exception as exc:  # noqa: BLE001 - one failed pass must not stop the operator
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("twin operator pass failed: %s", self.last_error)
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name="twin-operator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.api_client.close()
