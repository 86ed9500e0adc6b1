"""The twin's other writers of replicas, through the official client: Dynamo's scaling adapter
controller (``adapters.py``) and the stand-in planner (``planner.py``). ``OperatorLoop`` runs
them at the start of each pass, before it reads its snapshot, as separate controllers would."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.cluster.dgd import DGD_GROUP, DGD_PLURAL
from powerfleet.twin.cluster.adapters import ADAPTER_PLURAL, reconcile_adapters
from powerfleet.twin.cluster.planner import StandInPlanner

MERGE = "application/merge-patch+json"
_TIMEOUT = 10.0


@dataclass
class OtherWrites:
    adapters_created: list[str] = field(default_factory=list)
    dgd_replica_writes: list[str] = field(default_factory=list)  # "<writer> <dgd>/<component>=<n>"
    errors: list[str] = field(default_factory=list)


@dataclass
class OtherWriters:
    custom: client.CustomObjectsApi
    namespace: str
    dgd_version: str
    planner: StandInPlanner | None = None

    def run(self, now: float) -> OtherWrites:
        out = OtherWrites()
        ns = self.namespace
        dgds = self.custom.list_namespaced_custom_object(DGD_GROUP, self.dgd_version, ns, DGD_PLURAL,
                                                         _request_timeout=_TIMEOUT)["items"]
        adapters = self.custom.list_namespaced_custom_object(DGD_GROUP, "v1beta1", ns, ADAPTER_PLURAL,
                                                             _request_timeout=_TIMEOUT)["items"]
        plan = reconcile_adapters(dgds, adapters)
        for body in plan.creates:
            if self._call(out, f"create adapter {body['metadata']['name']}", lambda b=body: self.custom.create_namespaced_custom_object(
                    DGD_GROUP, "v1beta1", ns, ADAPTER_PLURAL, b, _request_timeout=_TIMEOUT)):
                out.adapters_created.append(body["metadata"]["name"])
        for name in plan.deletes:
            self._call(out, f"delete adapter {name}", lambda n=name: self.custom.delete_namespaced_custom_object(
                DGD_GROUP, "v1beta1", ns, ADAPTER_PLURAL, n, _request_timeout=_TIMEOUT))
        for name, status in plan.status.items():
            self._call(out, f"adapter status {name}", lambda n=name, s=status: self.custom.patch_namespaced_custom_object_status(
                DGD_GROUP, "v1beta1", ns, ADAPTER_PLURAL, n, {"status": s}, _content_type=MERGE, _request_timeout=_TIMEOUT))
        self._replicas(out, "adapter", plan.dgd_replicas)
        if self.planner is not None:
            writes = self.planner.step(dgds, adapters, now)
            for name, replicas in writes.adapter_replicas.items():
                self._call(out, f"planner adapter {name}", lambda n=name, r=replicas: self.custom.patch_namespaced_custom_object(
                    DGD_GROUP, "v1beta1", ns, ADAPTER_PLURAL, n, {"spec": {"replicas": r}}, _content_type=MERGE,
                    _request_timeout=_TIMEOUT))
            self._replicas(out, "planner", writes.dgd_replicas)
        return out

    def _replicas(self, out: OtherWrites, writer: str, replicas: dict[str, dict[str, int]]) -> None:
        for dgd, comps in replicas.items():
            body = {"spec": {"services": {c: {"replicas": n} for c, n in comps.items()}}}
            if self._call(out, f"{writer} replicas {dgd}", lambda d=dgd, b=body: self.custom.patch_namespaced_custom_object(
                    DGD_GROUP, self.dgd_version, self.namespace, DGD_PLURAL, d, b, _content_type=MERGE,
                    _request_timeout=_TIMEOUT)):
                out.dgd_replica_writes.extend(f"{writer} {dgd}/{c}={n}" for c, n in sorted(comps.items()))

    @staticmethod
    def _call(out: OtherWrites, what: str, fn) -> bool:  # noqa: ANN001 - a thunk
        try:
            fn()
        except ApiException as exc:
            out.errors.append(f"{what}: HTTP {exc.status}")
            return False
        return True
