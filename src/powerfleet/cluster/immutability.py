"""Power inputs may not change on a running deployment.

For every component that carries the cap annotation (on either side), matched by *name*
(never by position), these may not change:

* the cap annotation string, compared verbatim (" 350 " -> "350" is a change);
* the effective main-container GPU count (limits, else requests; moving the same count from
  limits to requests is not a change);
* ``multinode.nodeCount`` as declared (adding or removing the field is a change, even to 1).

Two entry points share one comparison:

* ``validate_dgd_update(old, new)``: admission-style, for components present in both.
* ``AdmittedPowerInputs`` + ``check_power_inputs_unchanged(admitted, current)``: what the
  planner calls at each evaluation. Any violation means the deployment fails closed until an
  operator re-admits it (``admit_power_inputs(current)`` makes a fresh record).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from powerfleet.cluster.dgd import DGD, Component
from powerfleet.cluster.errors import DGDInputError
from powerfleet.cluster.power import PowerConfig, resolve_power_config

ABSENT = "<absent>"


class Violation(BaseModel):
    """One changed power input. ``old``/``new`` are the raw values (None: the field is absent)."""

    model_config = ConfigDict(frozen=True)

    path: str
    old: str | int | None
    new: str | int | None
    component: str = ""

    def line(self) -> str:
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"


class ComponentPowerFields(BaseModel):
    """The immutable power inputs of one component, with the paths they were read from."""

    model_config = ConfigDict(frozen=True)

    name: str
    annotation: str | None
    annotation_path: str
    gpus_per_pod: int  # effective (absent = 0)
    gpus_declared: bool = True  # False: no GPU count at all (reported as <absent>)
    gpu_path: str
    node_count: int | None  # as declared (absent = None, effective 1)
    node_count_path: str
    component_path: str

    @property
    def effective_node_count(self) -> int:
        return 1 if self.node_count is None else self.node_count

    @property
    def gpus_shown(self) -> int | None:
        return self.gpus_per_pod if self.gpus_declared else None

    @classmethod
    def of(cls, c: Component) -> ComponentPowerFields:
        return cls(
            name=c.name,
            annotation=c.power_annotation,
            annotation_path=c.paths.annotation(),
            gpus_per_pod=c.gpus_per_pod,
            gpus_declared=c.gpus_declared,
            gpu_path=c.gpu_path,
            node_count=c.node_count,
            node_count_path=c.paths.node_count,
            component_path=c.paths.component,
        )


def _show(value: str | int | None) -> str:
    """Strings quoted (so " 350 " and "350" differ visibly), integers bare, None as <absent>."""
    if value is None:
        return ABSENT
    return repr(value) if isinstance(value, str) else str(value)


def compare_component(old: ComponentPowerFields, new: ComponentPowerFields) -> list[Violation]:
    """Violations between two versions of one (annotated) component."""
    out: list[Violation] = []
    if old.annotation != new.annotation:
        out.append(Violation(path=new.annotation_path, old=old.annotation, new=new.annotation, component=new.name))
    # Effective values are compared (absent GPUs = 0, absent nodeCount = 1), so spelling out a
    # default is not a change; the raw values are reported, absent as <absent>.
    if old.gpus_per_pod != new.gpus_per_pod:
        out.append(Violation(path=new.gpu_path, old=old.gpus_shown, new=new.gpus_shown, component=new.name))
    if old.effective_node_count != new.effective_node_count:
        out.append(Violation(path=new.node_count_path, old=old.node_count, new=new.node_count, component=new.name))
    return out


def _annotated(fields: ComponentPowerFields) -> bool:
    return fields.annotation is not None


def validate_dgd_update(old: DGD, new: DGD) -> list[Violation]:
    """Admission check for an update. Annotated components are matched by name; adding,
    removing or renaming one is a violation (reported at the component path)."""
    out: list[Violation] = []
    new_by_name = {c.name: ComponentPowerFields.of(c) for c in new.components}
    old_names = {c.name for c in old.components}
    for c in old.components:
        o = ComponentPowerFields.of(c)
        n = new_by_name.get(c.name)
        if n is None:
            # Removing (or renaming away) a power-aware component changes the power layout.
            if _annotated(o):
                out.append(Violation(path=o.component_path, old=c.name, new=None, component=c.name))
            continue
        if _annotated(o) or _annotated(n):
            out.extend(compare_component(o, n))
    for name, n in new_by_name.items():
        if name not in old_names and _annotated(n):
            out.append(Violation(path=n.component_path, old=None, new=name, component=name))
    return out


class AdmittedPowerInputs(BaseModel):
    """What the planner admitted for one deployment; persist it (JSON) and compare each evaluation."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str
    uid: str
    generation: int | None
    power: PowerConfig
    components: dict[str, ComponentPowerFields]  # every annotated or power-role component


def admit_power_inputs(dgd: DGD, *, power: PowerConfig | None = None) -> AdmittedPowerInputs:
    """Admit (or re-admit) a deployment's power inputs. Raises PowerInputError if invalid.

    ``power``: the caller's ``resolve_power_config(dgd)``, when it has derived it already."""
    power = power if power is not None else resolve_power_config(dgd)
    role_names = {rp.component for rp in power.roles.values()}
    fields = {
        c.name: ComponentPowerFields.of(c)
        for c in dgd.components
        if c.name in role_names or c.power_annotation is not None
    }
    return AdmittedPowerInputs(
        namespace=dgd.namespace, name=dgd.name, uid=dgd.uid, generation=dgd.generation, power=power, components=fields
    )


def check_power_inputs_unchanged(admitted: AdmittedPowerInputs, current: DGD, *,
                                 resolved: PowerConfig | DGDInputError | None = None) -> list[Violation]:
    """Violations between the admitted inputs and the deployment as it is now.

    ``resolved``: the caller's ``resolve_power_config(current)`` result, or the error it raised,
    when it has derived it already (one evaluation derives a DGD's power inputs once).

    Empty list: carry on with the admitted caps. Non-empty: fail closed for this deployment
    until it is re-admitted. Also reports a recreated deployment (uid changed), a vanished
    admitted component, a new annotated component, and power inputs that no longer resolve.
    """
    out: list[Violation] = []
    if admitted.uid and current.uid and admitted.uid != current.uid:
        out.append(Violation(path="metadata.uid", old=admitted.uid, new=current.uid))
    current_by_name = {c.name: c for c in current.components}
    for name, old in admitted.components.items():
        comp = current_by_name.get(name)
        if comp is None:
            out.append(Violation(path=old.component_path, old=name, new=None, component=name))
            continue
        out.extend(compare_component(old, ComponentPowerFields.of(comp)))
    for comp in current.components:
        if comp.name not in admitted.components and comp.power_annotation is not None:
            out.append(
                Violation(path=comp.paths.annotation(), old=None, new=comp.power_annotation, component=comp.name)
            )
    if not out:
        if resolved is None:
            try:
                resolved = resolve_power_config(current)
            except DGDInputError as exc:
                resolved = exc
        if isinstance(resolved, DGDInputError):
            exc = resolved
            return [Violation(path=exc.path, old="valid", new=f"invalid: {exc.message}", component=exc.component)]
        roles = resolved.roles
        for role, rp in roles.items():
            before = admitted.power.roles.get(role)
            if before is None or before.component != rp.component:
                out.append(Violation(
                    path=current_by_name[rp.component].paths.type,
                    old=before.component if before else None,
                    new=rp.component,
                    component=rp.component,
                ))
    return out
