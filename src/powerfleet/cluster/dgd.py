"""The subset of a DynamoGraphDeployment (DGD) that powerfleet reads.

Two spec forms are accepted (docs/cluster.md has the details):

* ``spec.components``: a list of components keyed by ``name`` (the current form). The pod
  template is a Kubernetes PodTemplateSpec; the main container is the one named ``main``,
  or the first container when none is.
* ``spec.services``: the older map of services keyed by name, with ``componentType``,
  ``resources.{limits,requests}.gpu``, ``extraPodMetadata`` and ``extraPodSpec.mainContainer``.

Each parsed component remembers the exact field paths its values came from, so errors and
immutability violations can name them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from powerfleet.cluster.errors import DGDFormatError
# The status half of the model lives in cluster/status.py; its names are re-exported here.
from powerfleet.cluster.status import INT_RE, ComponentStatus, DGDStatus, RolloutPhase, opt_int, parse_status  # noqa: F401

DGD_GROUP = "nvidia.com"
DGD_VERSION = "v1alpha1"  # the oldest served version; KubeCluster discovers which ones the cluster serves
DGD_VERSIONS = ("v1beta1", "v1alpha1")  # preference order
DGD_PLURAL = "dynamographdeployments"
DGD_KIND = "DynamoGraphDeployment"
DGD_API_VERSION = f"{DGD_GROUP}/{DGD_VERSION}"

# Labels the Dynamo operator puts on the pods it renders for a DGD.
LABEL_DGD_NAME = "nvidia.com/dynamo-graph-deployment-name"
LABEL_COMPONENT = "nvidia.com/dynamo-component"

POWER_ANNOTATION = "dynamo.nvidia.com/gpu-power-limit"
GPU_RESOURCE = "nvidia.com/gpu"
MAIN_CONTAINER = "main"


class ComponentType(StrEnum):
    """Every component type seen in Dynamo's own manifests. Only the worker-like three can
    carry power inputs; the rest (and an untyped v1beta1 component) are read and ignored."""

    FRONTEND = "frontend"
    PREFILL = "prefill"
    DECODE = "decode"
    WORKER = "worker"
    PLANNER = "planner"
    EPP = "epp"
    DEFAULT = "default"
    MAIN = "main"


WORKER_LIKE = frozenset({ComponentType.WORKER, ComponentType.PREFILL, ComponentType.DECODE})


class FieldPaths(BaseModel):
    """Where a component's power-relevant values live in the DGD (for messages)."""

    model_config = ConfigDict(frozen=True)

    component: str
    type: str
    replicas: str
    annotations: str
    gpu_limits: str
    gpu_requests: str
    node_count: str

    def annotation(self, key: str = POWER_ANNOTATION) -> str:
        return f"{self.annotations}[{key}]"


class Component(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    type: ComponentType | None  # None: untyped (v1beta1 ``type`` is optional)
    sub_type: ComponentType | None = None  # v1alpha1 ``subComponentType`` (prefill/decode of a worker)
    replicas: int
    gpus_per_pod: int  # effective main-container GPU count: limits, else requests, else 0
    gpu_source: Literal["limits", "requests"] | None
    node_count: int | None  # as declared; None when multinode.nodeCount is absent
    # DRA: names in the main container's ``resources.claims``, and whether the pod template
    # declares ``resourceClaims``. A DRA-backed GPU has no count powerfleet can read.
    gpu_claims: tuple[str, ...] = ()
    pod_resource_claims: bool = False
    # The pod's resourceClaims: claim name -> its ResourceClaimTemplate's name ("" when the claim
    # names a ResourceClaim instead), so a claim's device class can be looked up (power.py).
    claim_templates: dict[str, str] = {}
    annotations: dict[str, str]
    labels: dict[str, str]
    paths: FieldPaths

    @property
    def effective_node_count(self) -> int:
        return 1 if self.node_count is None else self.node_count

    @property
    def gpus_declared(self) -> bool:
        return self.gpu_source is not None

    @property
    def gpu_path(self) -> str:
        return self.paths.gpu_requests if self.gpu_source == "requests" else self.paths.gpu_limits

    @property
    def power_annotation(self) -> str | None:
        return self.annotations.get(POWER_ANNOTATION)


class DGD(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str = ""
    generation: int | None = None
    resource_version: str = ""
    api_version: str = DGD_API_VERSION  # as read; writes go back through the same version
    labels: dict[str, str] = {}
    form: Literal["components", "services"]
    components: tuple[Component, ...]
    status: DGDStatus = DGDStatus()

    def component(self, name: str) -> Component | None:
        for c in self.components:
            if c.name == name:
                return c
        return None

    @property
    def pod_selector(self) -> str:
        """The label selector for every pod of this deployment (one LIST, partitioned locally)."""
        return f"{LABEL_DGD_NAME}={self.name}"

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> DGD:
        return parse_dgd(obj)


# --- parsing -------------------------------------------------------------------------------


def _mapping(value: Any, path: str, component: str = "") -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DGDFormatError(path, f"expected an object, got {type(value).__name__}", component=component)
    return value


def _string_map(value: Any, path: str, component: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in _mapping(value, path, component).items():
        if not isinstance(v, str):
            raise DGDFormatError(f"{path}[{k}]", f"expected a string, got {type(v).__name__}", component=component)
        out[str(k)] = v
    return out


def _count(value: Any, path: str, component: str, *, what: str) -> int:
    """A non-negative integer given as a JSON integer or a decimal string (quantity without suffix)."""
    if isinstance(value, bool):
        raise DGDFormatError(path, f"{value!r} is not a non-negative integer {what}", component=component)
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and INT_RE.fullmatch(value.strip()):
        return int(value.strip())
    raise DGDFormatError(path, f"{value!r} is not a non-negative integer {what}", component=component)


def _gpu_from(resources: Mapping[str, Any], key: str, base: str, component: str) -> tuple[int | None, int | None]:
    limits = _mapping(resources.get("limits"), f"{base}.limits", component)
    requests = _mapping(resources.get("requests"), f"{base}.requests", component)
    lim = limits.get(key)
    req = requests.get(key)
    return (
        None if lim is None else _count(lim, f"{base}.limits[{key}]", component, what="of GPUs"),
        None if req is None else _count(req, f"{base}.requests[{key}]", component, what="of GPUs"),
    )


def _component_type(raw: Any, path: str, component: str) -> ComponentType | None:
    if raw is None:
        return None
    try:
        return ComponentType(raw)
    except ValueError:
        allowed = ", ".join(t.value for t in ComponentType)
        raise DGDFormatError(path, f"unknown component type {raw!r} (expected one of: {allowed})", component=component) from None


def _node_count(spec: Mapping[str, Any], base: str, component: str) -> int | None:
    multinode = _mapping(spec.get("multinode"), f"{base}.multinode", component)
    raw = multinode.get("nodeCount")
    if raw is None:
        return None
    n = _count(raw, f"{base}.multinode.nodeCount", component, what="nodeCount")
    return n


def _parse_list_component(raw: Any, index: int) -> Component:
    item = _mapping(raw, f"spec.components[{index}]")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise DGDFormatError(f"spec.components[{index}].name", "every component needs a non-empty string name")
    base = f"spec.components[name={name}]"
    type_key = "type" if "type" in item or "componentType" not in item else "componentType"
    ctype = _component_type(item.get(type_key), f"{base}.{type_key}", name)
    sub_type = _component_type(item.get("subComponentType"), f"{base}.subComponentType", name)
    replicas = _count(item.get("replicas", 1), f"{base}.replicas", name, what="of replicas")
    template = _mapping(item.get("podTemplate"), f"{base}.podTemplate", name)
    meta = _mapping(template.get("metadata"), f"{base}.podTemplate.metadata", name)
    pod_spec = _mapping(template.get("spec"), f"{base}.podTemplate.spec", name)
    containers = pod_spec.get("containers") or []
    if not isinstance(containers, list):
        raise DGDFormatError(f"{base}.podTemplate.spec.containers", "expected a list", component=name)
    main: Mapping[str, Any] = {}
    main_name = MAIN_CONTAINER
    named = [c for c in containers if isinstance(c, Mapping) and c.get("name") == MAIN_CONTAINER]
    if named:
        main = named[0]
    elif containers:
        main = _mapping(containers[0], f"{base}.podTemplate.spec.containers[0]", name)
        main_name = str(main.get("name", "0"))
    cbase = f"{base}.podTemplate.spec.containers[name={main_name}].resources"
    main_resources = _mapping(main.get("resources"), cbase, name)
    lim, req = _gpu_from(main_resources, GPU_RESOURCE, cbase, name)
    gpus, source = _effective_gpus(lim, req)
    claims = _claim_names(main_resources, cbase, name)
    sidecar_gpus, sidecar_base = _native_sidecar_gpus(pod_spec, f"{base}.podTemplate.spec", name)
    if sidecar_gpus:
        # A native sidecar (init container with restartPolicy Always) holds its GPUs for the pod's
        # life, beside the main container's: they count. With none on main, its path is reported.
        if source is None:
            cbase, source = sidecar_base, "limits"
        gpus += sidecar_gpus
    paths = FieldPaths(
        component=base,
        type=f"{base}.{type_key}",
        replicas=f"{base}.replicas",
        annotations=f"{base}.podTemplate.metadata.annotations",
        gpu_limits=f"{cbase}.limits[{GPU_RESOURCE}]",
        gpu_requests=f"{cbase}.requests[{GPU_RESOURCE}]",
        node_count=f"{base}.multinode.nodeCount",
    )
    return _component(item, name, (ctype, sub_type), replicas, (gpus, source), meta,
                      f"{base}.podTemplate.metadata.labels", paths, (claims, bool(pod_spec.get("resourceClaims"))),
                      _claim_templates(pod_spec, f"{base}.podTemplate.spec", name))


def _native_sidecar_gpus(pod_spec: Mapping[str, Any], base: str, component: str) -> tuple[int, str]:
    """GPUs of the native sidecars (init containers with ``restartPolicy: Always``), and the
    resources path of the first one that has some."""
    inits = pod_spec.get("initContainers") or []
    if not isinstance(inits, list):
        raise DGDFormatError(f"{base}.initContainers", "expected a list", component=component)
    total, first = 0, ""
    for i, c in enumerate(inits):
        if not isinstance(c, Mapping) or c.get("restartPolicy") != "Always":
            continue
        cbase = f"{base}.initContainers[name={c.get('name', i)}].resources"
        lim, req = _gpu_from(_mapping(c.get("resources"), cbase, component), GPU_RESOURCE, cbase, component)
        n, _ = _effective_gpus(lim, req)
        if n and not first:
            first = cbase
        total += n
    return total, first


def _claim_templates(pod_spec: Mapping[str, Any], base: str, component: str) -> dict[str, str]:
    """The pod's resourceClaims: name -> ResourceClaimTemplate name ("" for a named ResourceClaim).
    Both spellings are read: ``resourceClaimTemplateName`` and the older ``source: {...}``."""
    raw = pod_spec.get("resourceClaims") or []
    if not isinstance(raw, list):
        raise DGDFormatError(f"{base}.resourceClaims", "expected a list", component=component)
    out: dict[str, str] = {}
    for entry in raw:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        source = entry.get("source") if isinstance(entry.get("source"), Mapping) else entry
        template = source.get("resourceClaimTemplateName")
        out[entry["name"]] = template if isinstance(template, str) else ""
    return out


def _claim_names(resources: Mapping[str, Any], base: str, component: str) -> tuple[str, ...]:
    raw = resources.get("claims")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise DGDFormatError(f"{base}.claims", "expected a list", component=component)
    return tuple(str(c.get("name", "")) if isinstance(c, Mapping) else str(c) for c in raw)


def _component(
    item: Mapping[str, Any],
    name: str,
    types: tuple[ComponentType | None, ComponentType | None],
    replicas: int,
    gpus: tuple[int, Literal["limits", "requests"] | None],
    meta: Mapping[str, Any],
    labels_path: str,
    paths: FieldPaths,
    dra: tuple[tuple[str, ...], bool],
    claim_templates: dict[str, str] | None = None,
) -> Component:
    return Component(
        name=name,
        type=types[0],
        sub_type=types[1],
        replicas=replicas,
        gpus_per_pod=gpus[0],
        gpu_source=gpus[1],
        gpu_claims=dra[0],
        pod_resource_claims=dra[1],
        claim_templates=claim_templates or {},
        node_count=_node_count(item, paths.component, name),
        annotations=_string_map(meta.get("annotations"), paths.annotations, name),
        labels=_string_map(meta.get("labels"), labels_path, name),
        paths=paths,
    )


def _effective_gpus(lim: int | None, req: int | None) -> tuple[int, Literal["limits", "requests"] | None]:
    if lim is not None:
        return lim, "limits"
    if req is not None:
        return req, "requests"
    return 0, None


def _parse_service(name: str, raw: Any) -> Component:
    base = f"spec.services[{name}]"
    item = _mapping(raw, base, name)
    ctype = _component_type(item.get("componentType"), f"{base}.componentType", name)
    sub_type = _component_type(item.get("subComponentType"), f"{base}.subComponentType", name)
    replicas = _count(item.get("replicas", 1), f"{base}.replicas", name, what="of replicas")
    meta = _mapping(item.get("extraPodMetadata"), f"{base}.extraPodMetadata", name)
    # Dynamo's own resources block (gpu: "N") wins over the main container's resources,
    # because the operator renders it onto the main container.
    own = _mapping(item.get("resources"), f"{base}.resources", name)
    own_lim, own_req = _gpu_from(own, "gpu", f"{base}.resources", name)
    cbase = f"{base}.extraPodSpec.mainContainer.resources"
    extra = _mapping(item.get("extraPodSpec"), f"{base}.extraPodSpec", name)
    main = _mapping(extra.get("mainContainer"), f"{base}.extraPodSpec.mainContainer", name)
    main_resources = _mapping(main.get("resources"), cbase, name)
    c_lim, c_req = _gpu_from(main_resources, GPU_RESOURCE, cbase, name)
    claims = _claim_names(main_resources, cbase, name)
    if own_lim is not None or own_req is not None:
        gpus, source = _effective_gpus(own_lim, own_req)
        lim_path, req_path = f"{base}.resources.limits.gpu", f"{base}.resources.requests.gpu"
    else:
        gpus, source = _effective_gpus(c_lim, c_req)
        lim_path, req_path = f"{cbase}.limits[{GPU_RESOURCE}]", f"{cbase}.requests[{GPU_RESOURCE}]"
    paths = FieldPaths(
        component=base,
        type=f"{base}.componentType",
        replicas=f"{base}.replicas",
        annotations=f"{base}.extraPodMetadata.annotations",
        gpu_limits=lim_path,
        gpu_requests=req_path,
        node_count=f"{base}.multinode.nodeCount",
    )
    return _component(item, name, (ctype, sub_type), replicas, (gpus, source), meta,
                      f"{base}.extraPodMetadata.labels", paths, (claims, bool(extra.get("resourceClaims"))),
                      _claim_templates(extra, f"{base}.extraPodSpec", name))


def parse_dgd(obj: Mapping[str, Any]) -> DGD:
    """Parse a DGD as the API returns it (a JSON object). Raises DGDFormatError."""
    if not isinstance(obj, Mapping):
        raise DGDFormatError("<root>", "a DGD must be a JSON/YAML object")
    meta = _mapping(obj.get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise DGDFormatError("metadata.name", "missing")
    spec = _mapping(obj.get("spec"), "spec")
    components: list[Component]
    if "components" in spec:
        raw_list = spec["components"]
        if not isinstance(raw_list, list):
            raise DGDFormatError("spec.components", "expected a list of components keyed by name")
        components = [_parse_list_component(item, i) for i, item in enumerate(raw_list)]
        form: Literal["components", "services"] = "components"
    elif "services" in spec:
        services = _mapping(spec["services"], "spec.services")
        components = [_parse_service(str(k), v) for k, v in services.items()]
        form = "services"
    else:
        raise DGDFormatError("spec.components", "missing (neither spec.components nor spec.services is set)")
    seen: set[str] = set()
    for c in components:
        if c.name in seen:
            raise DGDFormatError(c.paths.component, "duplicate component name", component=c.name)
        seen.add(c.name)
    return DGD(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid") or ""),
        generation=opt_int(meta.get("generation")),
        resource_version=str(meta.get("resourceVersion") or ""),
        api_version=str(obj.get("apiVersion") or DGD_API_VERSION),
        labels={str(k): str(v) for k, v in _mapping(meta.get("labels"), "metadata.labels").items()},
        form=form,
        components=tuple(components),
        status=parse_status(obj.get("status")),
    )
