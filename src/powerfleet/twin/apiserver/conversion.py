"""Version conversion of custom resources, the part Dynamo's conversion webhook plays for a real
server: objects are stored in the CRD's storage version and served in every served version.

DynamoGraphDeployment (storage v1alpha1, the ``spec.services`` map; served also as v1beta1, the
``spec.components`` list), component by component:

==========================================  ==========================================
v1alpha1 ``spec.services.<name>``            v1beta1 ``spec.components[i]``
==========================================  ==========================================
the map key                                 ``name``
``componentType``                           ``type``
``replicas``, ``multinode``, ``subComponentType``, ``scalingAdapter``, ``frontendSidecar``: as is
``extraPodMetadata.{annotations,labels}``   ``podTemplate.metadata.{annotations,labels}``
``extraPodSpec`` (less ``mainContainer``)   ``podTemplate.spec``
``extraPodSpec.mainContainer``              the container named ``main`` (first when none is)
``resources.{limits,requests}.gpu``         that container's ``resources`` ``nvidia.com/gpu`` (or
                                            ``gpuType``); ``cpu``, ``memory``, ``custom`` likewise
``envs``, ``livenessProbe``,                that container's ``env``, ``livenessProbe``,
``readinessProbe``                          ``readinessProbe``
==========================================  ==========================================

The components list is in name order (a stored map has no order). Spec level: ``envs`` <-> ``env``; ``backendFramework`` and ``restart`` as is. Status: ``services``
<-> ``components`` (``componentName`` <-> the last of ``componentNames``),
``rollingUpdate.updatedServices`` <-> ``updatedComponents``; other status keys as they are.

What the other version cannot carry is dropped (v1alpha1's ``dynamoNamespace``, ``ingress``,
``pvcs``, ``volumeMounts``, ...; v1beta1's spec ``annotations``, ``labels``,
``topologyConstraint``, ``experimental``, status ``runtimeNamespace``, ``scheduledReplicas``,
``gpusPer*``): they vanish when written through the version that lacks them. A write through
v1beta1 keeps a stored v1alpha1 component exactly when its v1beta1 form is unchanged, or changed
only in ``replicas`` (so a replica patch through v1beta1 is not a template change).

The scaling adapter's two versions have one schema: only ``apiVersion`` changes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
DGD_KEY = ("nvidia.com", "dynamographdeployments")
_SAME = ("replicas", "multinode", "subComponentType", "scalingAdapter", "frontendSidecar")
_CONTAINER_KEYS = {"envs": "env", "livenessProbe": "livenessProbe", "readinessProbe": "readinessProbe"}


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def convert(key: tuple[str, str], obj: Obj, version: str, *, previous: Obj | None = None) -> Obj:
    """``obj`` in ``version``; ``previous`` is the stored object a write replaces (or None)."""
    group, _, current = str(obj.get("apiVersion", "")).rpartition("/")
    if current == version:
        return obj
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{key[0]}/{version}"
    if key != DGD_KEY:
        return out
    if version == "v1beta1":
        if "spec" in out:
            out["spec"] = _spec_to_beta(_map(out["spec"]))
        if isinstance(out.get("status"), Mapping):
            out["status"] = _status(out["status"], "services", "components", "updatedServices", "updatedComponents")
        return out
    prev_spec = _map((previous or {}).get("spec")) if previous is not None else {}
    if "spec" in out:
        out["spec"] = _spec_to_alpha(_map(out["spec"]), prev_spec)
    if isinstance(out.get("status"), Mapping):
        out["status"] = _status(out["status"], "components", "services", "updatedComponents", "updatedServices")
    return out


# -- spec --


def _spec_to_beta(spec: Mapping[str, Any]) -> Obj:
    out: Obj = {k: copy.deepcopy(v) for k, v in spec.items() if k in ("backendFramework", "restart")}
    if "envs" in spec:
        out["env"] = copy.deepcopy(spec["envs"])
    if isinstance(spec.get("services"), Mapping):
        # A Go map marshals sorted by key: the list a v1alpha1 object converts to is in name order.
        out["components"] = [_component_to_beta(str(n), _map(s)) for n, s in sorted(spec["services"].items())]
    return out


def _spec_to_alpha(spec: Mapping[str, Any], prev: Mapping[str, Any]) -> Obj:
    out: Obj = {k: copy.deepcopy(v) for k, v in spec.items() if k in ("backendFramework", "restart")}
    if "env" in spec:
        out["envs"] = copy.deepcopy(spec["env"])
    for key in ("pvcs",):  # v1alpha1-only spec fields survive a write through v1beta1
        if key in prev:
            out[key] = copy.deepcopy(prev[key])
    if isinstance(spec.get("components"), list):
        before = _map(prev.get("services"))
        services: Obj = {}
        for item in spec["components"]:
            item = _map(item)
            name = str(item.get("name", ""))
            services[name] = _carry_over(_map(before.get(name)), item) if name in before else _component_to_alpha(item)
        out["services"] = services
    return out


def _carry_over(old: Mapping[str, Any], new_beta: Mapping[str, Any]) -> Obj:
    """The stored component when the write did not change what v1beta1 shows of it (bar replicas)."""
    seen = _component_to_beta(str(new_beta.get("name", "")), old)
    if {k: v for k, v in seen.items() if k != "replicas"} == {k: v for k, v in new_beta.items() if k != "replicas"}:
        kept = copy.deepcopy(dict(old))
        if "replicas" in new_beta:
            kept["replicas"] = new_beta["replicas"]
        else:
            kept.pop("replicas", None)
        return kept
    return _component_to_alpha(new_beta)


def _component_to_beta(name: str, svc: Mapping[str, Any]) -> Obj:
    out: Obj = {"name": name}
    if "componentType" in svc:
        out["type"] = svc["componentType"]
    out |= {k: copy.deepcopy(svc[k]) for k in _SAME if k in svc}
    meta = _map(svc.get("extraPodMetadata"))
    extra = dict(_map(svc.get("extraPodSpec")))
    main = dict(_map(extra.pop("mainContainer", None)))
    for alpha_key, container_key in _CONTAINER_KEYS.items():
        if alpha_key in svc:
            main[container_key] = copy.deepcopy(svc[alpha_key])
    own = _map(svc.get("resources"))
    if own:
        res = {k: dict(_map(v)) for k, v in _map(main.get("resources")).items()}
        for side in ("limits", "requests"):
            mine = _map(own.get(side))
            target = res.setdefault(side, {}) if mine else res.get(side, {})
            for field, value in mine.items():
                if field == "gpu":
                    target[str(mine.get("gpuType") or GPU)] = value
                elif field in ("cpu", "memory"):
                    target[field] = value
                elif field == "custom":
                    target |= dict(_map(value))
        if own.get("claims"):
            res["claims"] = copy.deepcopy(own["claims"])
        main["resources"] = res
    template: Obj = {}
    if meta:
        template["metadata"] = {k: copy.deepcopy(v) for k, v in meta.items() if k in ("annotations", "labels")}
    pod_spec = copy.deepcopy(extra)
    if main or "containers" in pod_spec:
        others = [c for c in pod_spec.get("containers") or [] if _map(c).get("name") != "main"]
        pod_spec["containers"] = [{"name": "main", **main}, *others] if main else others
    if pod_spec:
        template["spec"] = pod_spec
    if template:
        out["podTemplate"] = template
    return out


def _component_to_alpha(item: Mapping[str, Any]) -> Obj:
    out: Obj = {}
    if "type" in item:
        out["componentType"] = item["type"]
    out |= {k: copy.deepcopy(item[k]) for k in _SAME if k in item}
    template = _map(item.get("podTemplate"))
    meta = _map(template.get("metadata"))
    if meta:
        out["extraPodMetadata"] = {k: copy.deepcopy(v) for k, v in meta.items() if k in ("annotations", "labels")}
    pod_spec = copy.deepcopy(dict(_map(template.get("spec"))))
    containers = [dict(_map(c)) for c in pod_spec.pop("containers", None) or []]
    main = next((c for c in containers if c.get("name") == "main"), containers[0] if containers else None)
    if main is not None:
        containers = [c for c in containers if c is not main]
        for alpha_key, container_key in _CONTAINER_KEYS.items():
            if container_key in main:
                out[alpha_key] = main.pop(container_key)
        main.pop("name", None)
        pod_spec["mainContainer"] = main
    if containers:
        pod_spec["containers"] = containers
    if pod_spec:
        out["extraPodSpec"] = pod_spec
    return out


# -- status --


def _status(status: Mapping[str, Any], comps_from: str, comps_to: str, updated_from: str, updated_to: str) -> Obj:
    out = {k: copy.deepcopy(v) for k, v in status.items() if k != comps_from}
    if isinstance(status.get(comps_from), Mapping):
        out[comps_to] = {str(n): _component_status(_map(c), to_beta=comps_to == "components")
                         for n, c in status[comps_from].items()} if all(
            isinstance(c, Mapping) for c in status[comps_from].values()) else copy.deepcopy(status[comps_from])
    rolling = status.get("rollingUpdate")
    if isinstance(rolling, Mapping):
        moved = {k: copy.deepcopy(v) for k, v in rolling.items() if k != updated_from}
        if updated_from in rolling:
            moved[updated_to] = copy.deepcopy(rolling[updated_from])
        out["rollingUpdate"] = moved
    return out


_BETA_ONLY = ("runtimeNamespace", "scheduledReplicas", "gpusPerEngine", "gpusPerReplica")


def _component_status(comp: Mapping[str, Any], *, to_beta: bool) -> Obj:
    out = copy.deepcopy(dict(comp))
    if to_beta:
        name = out.pop("componentName", None)
        if name is not None and not out.get("componentNames"):
            out["componentNames"] = [name]
        return out
    for key in _BETA_ONLY:
        out.pop(key, None)
    names = out.get("componentNames")
    if isinstance(names, list) and names and "componentName" not in out:
        out["componentName"] = names[-1]  # the new (target) one during a rolling update
    return out
