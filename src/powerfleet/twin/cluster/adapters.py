"""Dynamo's scaling adapter controller, as a pure program (docs/twin.md, "Other writers").

A DGD component with ``scalingAdapter.enabled: true`` gets one DynamoGraphDeploymentScalingAdapter
named ``<dgd>-<component>`` (lower case) whose ``spec.replicas`` starts at the component's
replicas. From then on the adapter owns ``replicas``: the controller sets the DGD's replicas from
the adapter's ``spec.replicas`` and so overwrites any direct write to the DGD; an autoscaler (HPA,
KEDA, Dynamo's planner) scales the adapter instead. The adapter's status reports the DGD's
replicas and the pods' label selector. An adapter whose component no longer enables it goes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from powerfleet.cluster.dgd import LABEL_COMPONENT, LABEL_DGD_NAME

Obj = dict[str, Any]
ADAPTER_API_VERSION = "nvidia.com/v1beta1"
ADAPTER_KIND = "DynamoGraphDeploymentScalingAdapter"
ADAPTER_PLURAL = "dynamographdeploymentscalingadapters"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def adapter_name(dgd: str, component: str) -> str:
    return f"{dgd}-{component}".lower()


@dataclass
class AdapterPlan:
    creates: list[Obj] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    dgd_replicas: dict[str, dict[str, int]] = field(default_factory=dict)  # dgd -> component -> replicas
    status: dict[str, Obj] = field(default_factory=dict)  # adapter -> its status


def enabled_components(dgd: Mapping[str, Any]) -> dict[str, int]:
    """Component -> replicas, for the components of a v1alpha1 DGD that enable the adapter."""
    out: dict[str, int] = {}
    for name, svc in _map(_map(dgd.get("spec")).get("services")).items():
        svc = _map(svc)
        if _map(svc.get("scalingAdapter")).get("enabled") is True:
            replicas = svc.get("replicas", 1)
            out[str(name)] = replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 1
    return out


def reconcile_adapters(dgds: Sequence[Mapping[str, Any]], adapters: Sequence[Mapping[str, Any]]) -> AdapterPlan:
    plan = AdapterPlan()
    existing = {str(_map(a.get("metadata")).get("name")): a for a in adapters}
    wanted: set[str] = set()
    for dgd in dgds:
        meta = _map(dgd.get("metadata"))
        dname = str(meta.get("name"))
        for comp, replicas in enabled_components(dgd).items():
            name = adapter_name(dname, comp)
            wanted.add(name)
            selector = f"{LABEL_DGD_NAME}={dname},{LABEL_COMPONENT}={comp}"
            adapter = existing.get(name)
            if adapter is None:
                plan.creates.append({
                    "apiVersion": ADAPTER_API_VERSION, "kind": ADAPTER_KIND,
                    "metadata": {"name": name, "namespace": meta.get("namespace", "default"),
                                 "ownerReferences": [{"apiVersion": dgd.get("apiVersion"), "kind": dgd.get("kind"),
                                                      "name": dname, "uid": meta.get("uid", ""), "controller": True}]},
                    "spec": {"dgdRef": {"name": dname, "serviceName": comp}, "replicas": replicas},
                })
                continue
            want = _map(adapter.get("spec")).get("replicas")
            if isinstance(want, int) and want != replicas:
                plan.dgd_replicas.setdefault(dname, {})[comp] = want  # the adapter wins
                replicas = want
            status = {"replicas": replicas, "selector": selector}
            if {k: _map(adapter.get("status")).get(k) for k in status} != status:
                plan.status[name] = status
    plan.deletes = sorted(n for n in existing if n not in wanted)
    return plan
