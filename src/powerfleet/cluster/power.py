"""Power inputs of a DGD: the per-GPU cap annotation, per-role resolution, watts per replica.

Outcome of ``parse_power_annotation`` (also in docs/cluster.md):

=========  ======================================================
raw        outcome
=========  ======================================================
"350"      350 W, raw "350"
" 350 "    350 W, raw " 350 " (pods must carry " 350 " verbatim)
"0"        PowerInputError: must be positive
"-5"       PowerInputError: not a positive integer number of watts
"3.5e2"    PowerInputError: not a positive integer number of watts
"abc"      PowerInputError: not a positive integer number of watts
""         PowerInputError: empty
=========  ======================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from powerfleet.cluster.dgd import DGD, POWER_ANNOTATION, WORKER_LIKE, Component, ComponentType
from powerfleet.cluster.errors import PowerInputError

# Surrounding ASCII whitespace is tolerated; the value itself is ASCII digits only
# (no sign, no exponent, no underscores, no non-ASCII digits).
_WHITESPACE = " \t\r\n\f\v"
_DIGITS = re.compile(r"[0-9]+")
MAX_CAP_WATTS = 100_000  # per GPU; anything larger is a typo, not a cap


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    WORKER = "worker"  # the aggregated (non-disaggregated) generic worker


class CapAnnotation(BaseModel):
    model_config = ConfigDict(frozen=True)

    raw: str  # exactly as written on the DGD; settlement compares this against pods
    watts: int


def parse_power_annotation(raw: object, *, path: str = POWER_ANNOTATION, component: str = "") -> CapAnnotation:
    """Parse a ``dynamo.nvidia.com/gpu-power-limit`` value. Never raises anything but PowerInputError."""
    if raw is None:
        raise PowerInputError(path, "missing: the power cap annotation is required", component=component)
    if not isinstance(raw, str):
        raise PowerInputError(path, f"expected a string, got {type(raw).__name__}", component=component)
    value = raw.strip(_WHITESPACE)
    if not value:
        raise PowerInputError(path, f"{raw!r} is empty; expected a positive integer number of watts", component=component)
    if not _DIGITS.fullmatch(value) or len(value) > 9:
        raise PowerInputError(path, f"{raw!r} is not a positive integer number of watts", component=component)
    watts = int(value)
    if watts <= 0:
        raise PowerInputError(path, f"{raw!r} must be a positive number of watts", component=component)
    if watts > MAX_CAP_WATTS:
        raise PowerInputError(path, f"{raw!r} exceeds {MAX_CAP_WATTS} W per GPU", component=component)
    return CapAnnotation(raw=raw, watts=watts)


def watts_per_replica(cap_watts: int, gpus_per_pod: int, node_count: int = 1) -> int:
    """Watts one replica may draw: cap per GPU x GPUs per pod x nodeCount."""
    return cap_watts * gpus_per_pod * node_count


class RolePower(BaseModel):
    """The resolved power inputs of one role (one component)."""

    model_config = ConfigDict(frozen=True)

    role: Role
    component: str
    cap: CapAnnotation
    gpus_per_pod: int
    node_count: int

    @property
    def watts_per_replica(self) -> int:
        return watts_per_replica(self.cap.watts, self.gpus_per_pod, self.node_count)


class PowerConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    mode: str  # "disagg" (prefill + decode) or "agg" (one generic worker)
    roles: dict[Role, RolePower]

    def for_component(self, name: str) -> RolePower | None:
        for rp in self.roles.values():
            if rp.component == name:
                return rp
        return None


ClaimClasses = Mapping[str, tuple[str, ...]]  # ResourceClaimTemplate name -> its requests' device classes


def is_gpu_device_class(name: str) -> bool:
    """A DRA device class that allocates GPUs: ``gpu.nvidia.com``, ``mig.nvidia.com``,
    ``gpu.intel.com``... (its first DNS label says gpu or mig). An IMEX ComputeDomain channel
    (``compute-domain-default-channel.nvidia.com``) is not one."""
    first = name.split(".", 1)[0].lower()
    return "gpu" in first or first == "mig"


def _gpu_claims(component: Component, claim_classes: ClaimClasses | None) -> list[str]:
    """The main container's claims that do (or may) allocate GPUs: a claim whose template is not
    known counts as one; a claim whose every device class is not a GPU does not."""
    out = []
    for claim in component.gpu_claims:
        template = component.claim_templates.get(claim)
        classes = (claim_classes or {}).get(template) if template else None
        if classes is None or any(is_gpu_device_class(c) for c in classes):
            out.append(claim)
    return out


def component_power(component: Component, role: Role, claim_classes: ClaimClasses | None = None) -> RolePower:
    """Validate one component's power inputs; raises PowerInputError naming the field.
    ``claim_classes``: the device classes of the DGD namespace's ResourceClaimTemplates, where
    they were looked up (a claim for a non-GPU device leaves the nvidia.com/gpu count readable)."""
    cap = parse_power_annotation(
        component.power_annotation, path=component.paths.annotation(), component=component.name
    )
    gpu_claims = _gpu_claims(component, claim_classes)
    if gpu_claims:
        unknown = [c for c in gpu_claims if (component.claim_templates.get(c) or "") not in (claim_classes or {})]
        why = ("their templates could not be looked up" if unknown == gpu_claims
               else "they allocate GPUs and their count cannot be read")
        raise PowerInputError(
            component.paths.component,
            f"component {component.name!r} takes its GPUs through DRA resources.claims "
            f"({', '.join(gpu_claims)}); {why}, so power awareness is refused",
            component=component.name,
        )
    if component.gpus_per_pod <= 0:
        why = "DRA resourceClaims" if component.pod_resource_claims else "a CPU-only or mocker component"
        raise PowerInputError(
            component.gpu_path,
            f"component {component.name!r} requests no nvidia.com/gpu ({why}?); "
            "power awareness is refused for a component without GPUs",
            component=component.name,
        )
    if component.node_count is not None and component.node_count <= 0:
        raise PowerInputError(
            component.paths.node_count,
            f"{component.node_count} is not a positive nodeCount",
            component=component.name,
        )
    return RolePower(
        role=role,
        component=component.name,
        cap=cap,
        gpus_per_pod=component.gpus_per_pod,
        node_count=component.effective_node_count,
    )


def role_from_name(name: str) -> Role | None:
    """A name that says prefill or decode (and not both), case-insensitively."""
    low = name.lower()
    pre, dec = "prefill" in low, "decode" in low
    if pre != dec:
        return Role.PREFILL if pre else Role.DECODE
    return None


def declared_role(c: Component) -> Role | None:
    """prefill/decode from ``type``, or ``subComponentType`` of a worker; None otherwise."""
    if c.type in (ComponentType.PREFILL, ComponentType.DECODE):
        return Role(c.type.value)
    if c.type is ComponentType.WORKER and c.sub_type in (ComponentType.PREFILL, ComponentType.DECODE):
        return Role(c.sub_type.value)
    return None


def is_worker_like(c: Component) -> bool:
    """Worker-like components carry power inputs: worker/prefill/decode, or an untyped
    component whose name says prefill or decode. frontend, planner, epp, default, main don't."""
    if c.type is None:
        return role_from_name(c.name) is not None
    return c.type in WORKER_LIKE


def power_relevant_components(dgd: DGD) -> dict[Role, Component]:
    """Which component plays which power role: the one role resolver that validation, GPU
    counting and power resolution share. Raises PowerInputError on an ambiguous layout.

    * one worker-like component (even a lone ``decode``): aggregated, role ``worker``;
    * two: each resolves to prefill or decode from its ``type``, its ``subComponentType``,
      or else its name ("VllmPrefillWorker", "decode"); exactly one of each is required;
    * more than two: refused.
    """
    list_path = "spec.components" if dgd.form == "components" else "spec.services"
    workers = [c for c in dgd.components if is_worker_like(c)]
    if not workers:
        raise PowerInputError(list_path, "no worker-like component (worker, prefill or decode)")
    if len(workers) == 1:
        return {Role.WORKER: workers[0]}
    if len(workers) > 2:
        names = ", ".join(repr(c.name) for c in workers)
        raise PowerInputError(
            workers[2].paths.type,
            f"{len(workers)} worker-like components ({names}); power awareness supports one (aggregated) "
            "or a prefill/decode pair",
            component=workers[2].name,
        )
    roles: dict[Role, Component] = {}
    for c in workers:
        role = declared_role(c) or role_from_name(c.name)
        if role is None:
            names = " and ".join(repr(w.name) for w in workers)
            raise PowerInputError(
                c.paths.type,
                f"two worker components ({names}) and {c.name!r} is neither typed prefill/decode, "
                "nor has subComponentType, nor a name that says prefill or decode; power awareness is refused",
                component=c.name,
            )
        if role in roles:
            raise PowerInputError(
                c.paths.type,
                f"a second {role.value!r} component (first is {roles[role].name!r}); one component per power role",
                component=c.name,
            )
        roles[role] = c
    return {Role.PREFILL: roles[Role.PREFILL], Role.DECODE: roles[Role.DECODE]}


def resolve_power_config(dgd: DGD, claim_classes: ClaimClasses | None = None) -> PowerConfig:
    """Resolve per-role power inputs (prefill/decode, or the generic worker for agg).
    ``claim_classes``: see ``component_power``."""
    roles = power_relevant_components(dgd)
    resolved = {role: component_power(c, role, claim_classes) for role, c in roles.items()}
    return PowerConfig(mode="agg" if Role.WORKER in resolved else "disagg", roles=resolved)
