"""When may a deployment's caps be cached? A pure function of the DGD and its pods.

Settled means: every power-relevant component has finished rolling out (status says so, for
the current generation, with all replicas ready and updated) and every live pod of it carries
the expected annotation string *verbatim* (the operator copies it unchanged; " 350 " on the DGD
must be " 350 " on the pod). A failed rollout is reported at once (FAILED), never waited out.
Pods come from one label-selected LIST of the whole deployment, partitioned here by component.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from powerfleet.cluster.dgd import DGD, LABEL_COMPONENT, LABEL_DGD_NAME, POWER_ANNOTATION, RolloutPhase
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.power import PowerConfig, RolePower, resolve_power_config


class SettlementState(StrEnum):
    SETTLED = "settled"
    PENDING = "pending"
    FAILED = "failed"


class Settlement(BaseModel):
    model_config = ConfigDict(frozen=True)

    state: SettlementState
    reasons: tuple[str, ...] = ()
    power: PowerConfig | None = None  # set only when SETTLED: the caps that may be cached

    @property
    def settled(self) -> bool:
        return self.state is SettlementState.SETTLED


def partition_pods(dgd: DGD, pods: Sequence[PodInfo]) -> dict[str, list[PodInfo]]:
    """Group this deployment's pods by component label (pods of other deployments are dropped)."""
    out: dict[str, list[PodInfo]] = {c.name: [] for c in dgd.components}
    for pod in pods:
        if pod.namespace != dgd.namespace or pod.labels.get(LABEL_DGD_NAME) != dgd.name:
            continue
        comp = pod.labels.get(LABEL_COMPONENT)
        if comp in out:
            out[comp].append(pod)
    return out


def _component_failure(dgd: DGD, rp: RolePower) -> str | None:
    st = dgd.status.components.get(rp.component)
    if st is not None and st.rollout is RolloutPhase.FAILED:
        return f"component {rp.component!r}: rollout failed" + (f": {st.message}" if st.message else "")
    return None


def _component_pending(dgd: DGD, rp: RolePower, pods: list[PodInfo]) -> list[str]:
    comp = dgd.component(rp.component)
    assert comp is not None
    name = rp.component
    reasons: list[str] = []
    st = dgd.status.components.get(name)
    if st is None:
        return [f"component {name!r}: no status yet"]
    if st.rollout in (RolloutPhase.PENDING, RolloutPhase.IN_PROGRESS):
        reasons.append(f"component {name!r}: rollout {st.rollout.value}")
    want = comp.replicas
    if st.ready_replicas != want:
        reasons.append(f"component {name!r}: {st.ready_replicas} of {want} replicas ready")
    if st.updated_replicas is not None and st.updated_replicas != want:
        reasons.append(f"component {name!r}: {st.updated_replicas} of {want} replicas updated")
    terminating = [p.name for p in pods if p.terminating]
    if terminating:
        reasons.append(f"component {name!r}: pods still terminating: {', '.join(sorted(terminating))}")
    live = [p for p in pods if not p.terminating and p.is_running_or_starting]
    want_pods = want * rp.node_count
    if len(live) != want_pods:
        reasons.append(f"component {name!r}: {len(live)} live pods, expected {want_pods}")
    for p in sorted(live, key=lambda p: p.name):
        got = p.annotations.get(POWER_ANNOTATION)
        if got != rp.cap.raw:
            reasons.append(
                f"component {name!r}: pod {p.name} has {POWER_ANNOTATION}={got!r}, expected {rp.cap.raw!r}"
            )
    return reasons


def settle(dgd: DGD, pods: Sequence[PodInfo], *, power: PowerConfig | None = None) -> Settlement:
    """Decide settlement. Raises PowerInputError when the DGD's power inputs are invalid.

    ``power``: the caller's ``resolve_power_config(dgd)``, when it has derived it already."""
    power = power if power is not None else resolve_power_config(dgd)
    if dgd.status.rollout is RolloutPhase.FAILED:
        msg = "deployment rollout failed" + (f": {dgd.status.rollout_message}" if dgd.status.rollout_message else "")
        return Settlement(state=SettlementState.FAILED, reasons=(msg,))
    failures = [f for rp in power.roles.values() if (f := _component_failure(dgd, rp))]
    if failures:
        return Settlement(state=SettlementState.FAILED, reasons=tuple(failures))
    reasons: list[str] = []
    observed = dgd.status.observed_generation
    # A controller may report a generation newer than the one we read (it saw a later write).
    if dgd.generation is not None and (observed is None or observed < dgd.generation):
        reasons.append(
            f"status observedGeneration {dgd.status.observed_generation} is behind generation {dgd.generation}"
        )
    if dgd.status.rollout in (RolloutPhase.PENDING, RolloutPhase.IN_PROGRESS):
        reasons.append(f"deployment rollout {dgd.status.rollout.value}")
    by_component = partition_pods(dgd, pods)
    for rp in power.roles.values():
        reasons.extend(_component_pending(dgd, rp, by_component.get(rp.component, [])))
    if reasons:
        return Settlement(state=SettlementState.PENDING, reasons=tuple(reasons))
    return Settlement(state=SettlementState.SETTLED, power=power)
