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
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from powerfleet.cluster.dgd import DGD, POWER_ANNOTATION, Component, ComponentType
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


def component_power(component: Component, role: Role) -> RolePower:
    """Validate one component's power inputs; raises PowerInputError naming the field."""
    cap = parse_power_annotation(
        component.power_annotation, path=component.paths.annotation(), component=component.name
    )
    if component.gpus_per_pod <= 0:
        raise PowerInputError(
            component.gpu_path,
            f"GPUs per pod is {component.gpus_per_pod}; a power-capped component needs at least one GPU",
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


def power_relevant_components(dgd: DGD) -> dict[Role, Component]:
    """Which component plays which power role. Raises PowerInputError on an ambiguous layout.

    Disaggregated: exactly one ``prefill`` and one ``decode`` component, and no generic
    ``worker``. Aggregated: no prefill/decode and exactly one ``worker``. Frontends never draw
    GPU power here.
    """
    by_type: dict[ComponentType, list[Component]] = {t: [] for t in ComponentType}
    for c in dgd.components:
        by_type[c.type].append(c)
    for t in (ComponentType.PREFILL, ComponentType.DECODE, ComponentType.WORKER):
        if len(by_type[t]) > 1:
            extra = by_type[t][1]
            raise PowerInputError(
                extra.paths.type,
                f"a second {t.value!r} component (first is {by_type[t][0].name!r}); one component per power role",
                component=extra.name,
            )
    prefill, decode, worker = (by_type[ComponentType.PREFILL], by_type[ComponentType.DECODE], by_type[ComponentType.WORKER])
    list_path = "spec.components" if dgd.form == "components" else "spec.services"
    if prefill or decode:
        if worker:
            raise PowerInputError(
                worker[0].paths.type,
                "a generic 'worker' next to prefill/decode components; cannot tell its power role",
                component=worker[0].name,
            )
        if not prefill or not decode:
            missing = "prefill" if not prefill else "decode"
            raise PowerInputError(list_path, f"disaggregated deployment has no {missing!r} component")
        return {Role.PREFILL: prefill[0], Role.DECODE: decode[0]}
    if worker:
        return {Role.WORKER: worker[0]}
    raise PowerInputError(list_path, "no prefill, decode or worker component")


def resolve_power_config(dgd: DGD) -> PowerConfig:
    """Resolve per-role power inputs (prefill/decode, or the generic worker for agg)."""
    roles = power_relevant_components(dgd)
    resolved = {role: component_power(c, role) for role, c in roles.items()}
    return PowerConfig(mode="agg" if Role.WORKER in resolved else "disagg", roles=resolved)
