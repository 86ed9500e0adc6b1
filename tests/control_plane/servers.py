"""One handle on either API server, so that a differential test makes the same client calls against
the loopback server (src/powerfleet/twin/apiserver) and the real kube-apiserver."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from powerfleet.twin.apiserver import ApiServer
from tests.waiting import wait_for

GROUP, PLURAL = "nvidia.com", "dynamographdeployments"


@dataclass
class Server:
    kind: str  # "loopback" | "real"
    api: client.ApiClient
    namespace: str
    loopback: ApiServer | None = None

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             query: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
        """A request through the client's transport (its auth, its TLS; the body JSON-encoded): status, JSON body, headers."""
        method_, url, headers, _, _ = self.api.param_serialize(
            method, path, query_params=query or [], header_params={"Content-Type": content_type,
                                                                     "Accept": "application/json"},
            auth_settings=["BearerToken"])
        resp = self.api.call_api(method_, url, header_params=headers, body=body)
        raw = resp.read()
        return resp.status, json.loads(raw or b"{}"), dict(resp.headers or {})

    def other_namespace(self) -> str:
        """A second namespace (created on the real server; the loopback server needs none)."""
        name = f"{self.namespace}-b"
        if self.kind == "real":
            self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        return name

    def forget_history(self) -> None:
        """Make version "1" too old to watch pods from. The loopback server forgets its event log.
        The real server's watch cache replays anything it holds, and drops its oldest events only
        once they are older than 75 s and its buffer is full: pods are written (in a namespace of
        their own) until a watch from "1" answers 410, which takes that long."""
        if self.loopback is not None:
            self.loopback.store.log.clear()
            return
        churn = f"churn-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=churn)))
        try:
            wait_for(lambda: self._churned(churn), "the watch cache to drop version 1", timeout_s=240, every_s=0)
        finally:
            self.core.delete_namespace(churn)

    def _churned(self, ns: str) -> bool:
        for i in range(25):
            self.core.create_namespaced_pod(ns, pod(f"c-{i}"))
        self.core.delete_collection_namespaced_pod(ns)
        w = watch.Watch()
        try:
            for _ in w.stream(self.core.list_namespaced_pod, self.namespace, resource_version="1", timeout_seconds=1):
                return False
        except ApiException as exc:
            return exc.status == 410
        return False

    def dgd(self, name: str = "llm", **spec_extra: Any) -> dict[str, Any]:
        return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"services": {"decode": {"componentType": "worker", "replicas": 1}}, **spec_extra}}

    def create_dgd(self, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, "v1alpha1", self.namespace, PLURAL, body, **kwargs)

    def dgd_path(self, name: str = "", sub: str = "") -> str:
        base = f"/apis/{GROUP}/v1alpha1/namespaces/{self.namespace}/{PLURAL}"
        return base + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def fails(call: Callable[[], Any], code: int) -> dict[str, Any]:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == code, info.value.body
    return json.loads(info.value.body)


def pod(name: str, *, node: str | None = None, **meta: Any) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, **meta),
                        spec=client.V1PodSpec(node_name=node, scheduler_name="none", containers=[client.V1Container(name="c", image="x")]))
