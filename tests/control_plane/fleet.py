"""The chart's RBAC (and its admission policy) applied to the real API server, with a ServiceAccount
token per component: what the tier's RBAC, admission and budget tests run under."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, utils

from powerfleet.testing.controlplane import ControlPlane
from tests.control_plane.cluster import admin_client, client_for_token, helm_template, service_account_token

RELEASE = "pf"
RBAC_KINDS = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# Everything on that grants something: retune (leases), budget with rack groups (nodes, pods
# cluster-wide) and the ledger's pods kept by a watch (pods watch).
VALUES: dict[str, Any] = {"retune": {"enabled": True}, "budget": {"enabled": True},
                          "config": {"budget": {"groups": {"rack-a": 40000}, "pod_source": "watch"}}}
SA = {"worker": f"{RELEASE}-powerfleet-worker", "agent": f"{RELEASE}-powerfleet-agent",
      "beat": f"{RELEASE}-powerfleet-beat", "redis": f"{RELEASE}-powerfleet-redis",
      "agent-drain": f"{RELEASE}-powerfleet-agent-drain"}


@dataclass
class FleetRbac:
    plane: ControlPlane
    namespace: str
    tmp: Path
    objects: list[dict[str, Any]] = field(default_factory=list)
    clients: list[client.ApiClient] = field(default_factory=list)

    @classmethod
    def install(cls, plane: ControlPlane, tmp: Path, values: dict[str, Any] | None = None) -> FleetRbac:
        ns = f"fleet-{uuid.uuid4().hex[:6]}"
        fleet = cls(plane, ns, tmp)
        api = admin_client(plane)
        try:
            client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            rendered = helm_template(plane, RELEASE, ns, values if values is not None else VALUES, tmp)
            fleet.objects = [o for o in rendered if o["kind"] in RBAC_KINDS]
            for obj in fleet.objects:
                utils.create_from_dict(api, obj, namespace=ns)
        finally:
            api.close()
        return fleet

    def token(self, component: str, *, bound_pod: client.V1Pod | None = None) -> str:
        api = admin_client(self.plane)
        try:
            return service_account_token(client.CoreV1Api(api), self.namespace, SA[component], bound_pod=bound_pod)
        finally:
            api.close()

    def client(self, component: str, *, bound_pod: client.V1Pod | None = None) -> client.ApiClient:
        api = client_for_token(self.plane, self.tmp, self.token(component, bound_pod=bound_pod),
                               f"{component}-{uuid.uuid4().hex[:4]}", self.namespace)
        self.clients.append(api)
        return api

    def close(self) -> None:
        for api in self.clients:
            api.close()


def allowed(api: client.ApiClient, verb: str, group: str, resource: str, namespace: str | None) -> bool:
    """SelfSubjectAccessReview: what the real authorizer answers for the client's own identity."""
    res, _, sub = resource.partition("/")
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(verb=verb, group=group, resource=res,
                                                        subresource=sub or None, namespace=namespace)))
    return bool(client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed)
