"""The twin's operator as a pure program: a snapshot in, the complete desired state out.

Written to the reconcile contract (docs/twin.md, ../shared/seeds/001): ``reconcile`` takes a
read-only snapshot (the DGDs, every pod, the nodes) and returns a ``Plan``: the pods to create
and delete, each pod's next status (the kubelet's part: Pending -> Running -> Ready, one step
per pass), and each DGD's complete desired status (observedGeneration, per-component replica
counts, rollout phase, the Ready condition) together with the status-transition events that
belong to it. It performs no I/O; ``powerfleet.twin.cluster.writer`` is the one writer that persists
a plan and emits events only after a write that changed something.

Time comes in as ``now`` (the injected clock): pods turn Ready after their component's startup
delay, and a deleted pod stays Terminating (GPUs held, not counted as a replica) until its
deadline, when the plan removes it (``twin/cluster/kubelet.py``). The status is rendered in Dynamo's
field names by ``twin/cluster/dgdstatus.py``; ``OperatorSettings`` (``twin/fidelity.py``) holds the knobs.

It also schedules (twin/cluster/scheduler.py, as kube-scheduler filters: cordons, nodeSelector and required
node affinity, taints and tolerations, allocatable ``nvidia.com/gpu``): a new pod goes to the
fitting node with the most free GPUs (spreading the two racks), and is given concrete GPU indices
(the device plugin's part), recorded in the pod annotation ``twin.powerfleet.io/gpus``; one that
fits nowhere stays Pending with ``PodScheduled=False``, reason ``Unschedulable``, until room appears. A rollout is surge-one: a pod of the new template is
added, and an old pod is removed only once the ready count exceeds the desired replicas; when
the surge pod finds no GPUs, one old pod goes first (replace in place).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from powerfleet.cluster.dgd import GPU_RESOURCE, LABEL_COMPONENT, LABEL_DGD_NAME
from powerfleet.cluster.gpu_pods import pod_gpus as spec_gpus
from powerfleet.twin.cluster.dgdstatus import ComponentCounts, render, was_ready
from powerfleet.twin.fidelity import OperatorSettings
from powerfleet.twin.cluster.kubelet import expired, is_ready, next_status, terminating
from powerfleet.twin.cluster.scheduler import GPUS_ANNOTATION, NodeView, Scheduler, pod_gpu_indices, unschedulable

Obj = dict[str, Any]
HASH_LABEL = "twin.powerfleet.io/template-hash"
_DEFAULT = OperatorSettings()


@dataclass(frozen=True)
class ComponentSpec:
    name: str
    type: str
    replicas: int
    gpus: int
    annotations: dict[str, str]
    labels: dict[str, str]
    image: str
    template_hash: str
    scheduling: Mapping[str, Any] = field(default_factory=dict)  # the template's nodeSelector, affinity, tolerations


@dataclass(frozen=True)
class Event:
    """An event about ``kind/name``; emitted by the writer only after its write changed something."""

    kind: str
    name: str
    reason: str
    message: str
    type: str = "Normal"


@dataclass
class Plan:
    creates: list[Obj] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)  # graceful: the pod turns Terminating
    removals: list[str] = field(default_factory=list)  # terminating pods past their deadline: gone now
    pod_status: dict[str, Obj] = field(default_factory=dict)  # pod name -> its next status
    placements: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # late binding of Pending pods
    dgd_status: dict[str, Obj] = field(default_factory=dict)  # DGD name -> complete desired status
    status_events: dict[str, list[Event]] = field(default_factory=dict)  # emitted after that DGD's status write


def _int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return default


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:8]


def components(dgd: Mapping[str, Any]) -> list[ComponentSpec]:
    """Each component's replicas, GPUs and pod template, from either DGD form. Lenient by design:
    the twin's operator renders what it can; validation is the fleet's job, not the twin's."""
    spec = _map(dgd.get("spec"))
    out: list[ComponentSpec] = []
    if isinstance(spec.get("components"), list):
        for item in spec["components"]:
            item = _map(item)
            template = _map(item.get("podTemplate"))
            meta = _map(template.get("metadata"))
            containers = _map(template.get("spec")).get("containers")
            if not isinstance(containers, list) or not containers:
                containers = [{}]
            main = next((c for c in containers if _map(c).get("name") == "main"), _map(containers[0]))
            res = _map(main.get("resources"))
            gpus = _int(_map(res.get("limits")).get(GPU_RESOURCE), _int(_map(res.get("requests")).get(GPU_RESOURCE)))
            rest = {k: v for k, v in item.items() if k != "replicas"}
            out.append(ComponentSpec(str(item.get("name", "")), str(item.get("type") or item.get("componentType") or ""),
                                     _int(item.get("replicas", 1), 1), gpus, dict(_map(meta.get("annotations"))),
                                     dict(_map(meta.get("labels"))), str(main.get("image", "")), _hash(rest),
                                     _scheduling(_map(template.get("spec")))))
    else:
        for name, item in _map(spec.get("services")).items():
            item = _map(item)
            meta = _map(item.get("extraPodMetadata"))
            main = _map(_map(item.get("extraPodSpec")).get("mainContainer"))
            res = _map(item.get("resources"))
            gpus = _int(_map(res.get("limits")).get("gpu"), _int(_map(res.get("requests")).get("gpu")))
            if not gpus:
                mres = _map(main.get("resources"))
                gpus = _int(_map(mres.get("limits")).get(GPU_RESOURCE), _int(_map(mres.get("requests")).get(GPU_RESOURCE)))
            rest = {k: v for k, v in item.items() if k != "replicas"}
            out.append(ComponentSpec(str(name), str(item.get("subComponentType") or item.get("componentType") or ""),
                                     _int(item.get("replicas", 1), 1), gpus, dict(_map(meta.get("annotations"))),
                                     dict(_map(meta.get("labels"))), str(main.get("image", "")), _hash(rest),
                                     _scheduling(_map(item.get("extraPodSpec")))))
    return [c for c in out if c.name]


_ready = is_ready
pod_gpus = pod_gpu_indices  # the GPU indices a pod was given (twin/cluster/scheduler.py)
_SCHEDULING = ("nodeSelector", "affinity", "tolerations")  # what a pod template says of where it may run


def _scheduling(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: pod_spec[k] for k in _SCHEDULING if k in pod_spec}


def _pod_manifest(dgd: Mapping[str, Any], comp: ComponentSpec, ordinal: int,
                  placed: tuple[str, list[int]] | str, grace_s: int) -> Obj:
    meta = _map(dgd.get("metadata"))
    dgd_name = str(meta.get("name"))
    annotations = dict(comp.annotations)
    spec: Obj = {"containers": [{"name": "main", "image": comp.image or "twin",
                                 "resources": {"limits": {GPU_RESOURCE: str(comp.gpus)}} if comp.gpus else {}}],
                 "restartPolicy": "Always", "terminationGracePeriodSeconds": grace_s, **comp.scheduling}
    status: Obj = {"phase": "Pending"}
    if isinstance(placed, tuple):
        spec["nodeName"] = placed[0]
        annotations[GPUS_ANNOTATION] = ",".join(str(i) for i in placed[1])
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    else:
        status["conditions"] = [unschedulable(placed)]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{dgd_name}-{comp.name}-{comp.template_hash[:6]}-{ordinal}".lower(),
            "namespace": meta.get("namespace", "default"),
            "labels": {**comp.labels, LABEL_DGD_NAME: dgd_name, LABEL_COMPONENT: comp.name,
                       HASH_LABEL: comp.template_hash},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": dgd.get("apiVersion"), "kind": dgd.get("kind"), "name": dgd_name,
                                 "uid": meta.get("uid", ""), "controller": True}],
        },
        "spec": spec,
        "status": status,
    }


def _ordinals(pods: Sequence[Mapping[str, Any]]) -> set[int]:
    out = set()
    for p in pods:
        tail = str(_map(p.get("metadata")).get("name", "")).rsplit("-", 1)[-1]
        if tail.isdigit():
            out.add(int(tail))
    return out


def reconcile(dgds: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
              nodes: Sequence[NodeView] | Mapping[str, int], *, now: float = 0.0,
              settings: OperatorSettings = _DEFAULT) -> Plan:
    """The whole desired state for one pass. ``nodes``: the nodes in scheduling order (NodeViews,
    or node name -> GPU count). Terminating pods hold their GPUs (the scheduler counts them) until
    their deadline. A pod no DGD owns (another tenant's) is scheduled and stepped too: bound once
    it fits (twin/cluster/scheduler.py), then started by the kubelet."""
    plan = Plan()
    sched = Scheduler(nodes, pods)
    by_dgd: dict[str, list[Mapping[str, Any]]] = {}
    held: dict[str, list[Mapping[str, Any]]] = {}  # terminating pods per DGD (their names are taken)
    for p in pods:
        if terminating(p):
            if expired(p, now):
                plan.removals.append(str(_map(p.get("metadata")).get("name")))
            held.setdefault(str(_map(_map(p.get("metadata")).get("labels")).get(LABEL_DGD_NAME)), []).append(p)
            continue
        owner = _map(_map(p.get("metadata")).get("labels")).get(LABEL_DGD_NAME)
        if owner:
            by_dgd.setdefault(str(owner), []).append(p)
        else:
            _schedule_unowned(p, sched, plan, now)
    for dgd in sorted(dgds, key=lambda d: str(_map(d.get("metadata")).get("name"))):
        dname = str(_map(dgd.get("metadata")).get("name"))
        _reconcile_dgd(dgd, by_dgd.get(dname, []), held.get(dname, []), sched, plan, now, settings)
    names = {str(_map(d.get("metadata")).get("name")) for d in dgds}
    for owner, owned in by_dgd.items():
        if owner not in names:  # the DGD is gone: garbage-collect its pods
            plan.deletes.extend(str(_map(p.get("metadata")).get("name")) for p in owned)
    return plan


def _schedule_unowned(pod: Mapping[str, Any], sched: Scheduler, plan: Plan, now: float) -> None:
    """A pod the operator does not own: the scheduler binds it when it fits, the kubelet starts it."""
    name = str(_map(pod.get("metadata")).get("name"))
    spec = _map(pod.get("spec"))
    if spec.get("nodeName"):
        nxt = next_status(pod, now, 0.0)
        if nxt is not None:
            plan.pod_status[name] = nxt
        return
    placed = sched.place(spec, spec_gpus(spec))
    if isinstance(placed, tuple):
        plan.placements[name] = placed
        return
    # As kube-scheduler does: the reason it fits nowhere (an untolerated taint, too few GPUs), written once.
    cond = unschedulable(placed)
    if cond not in (_map(pod.get("status")).get("conditions") or []):
        plan.pod_status[name] = {"phase": "Pending", "conditions": [cond]}


def _reconcile_dgd(dgd: Mapping[str, Any], pods: list[Mapping[str, Any]], held: list[Mapping[str, Any]],
                   sched: Scheduler, plan: Plan, now: float, settings: OperatorSettings) -> None:
    meta = _map(dgd.get("metadata"))
    name = str(meta.get("name"))
    comps = components(dgd)
    counts: list[ComponentCounts] = []
    # A graceful delete keeps the pod's GPUs until it is gone; only an immediate one frees them now.
    frees_now = settings.termination_grace_s <= 0
    by_comp: dict[str, list[Mapping[str, Any]]] = {}
    for p in pods:
        by_comp.setdefault(str(_map(_map(p.get("metadata")).get("labels")).get(LABEL_COMPONENT)), []).append(p)
    known = {c.name for c in comps}
    for cname, owned in by_comp.items():
        if cname not in known:  # a component removed from the spec
            for p in owned:
                plan.deletes.append(str(_map(p.get("metadata")).get("name")))
                if frees_now:
                    sched.release(p)
    for comp in comps:
        owned = sorted(by_comp.get(comp.name, []), key=lambda p: str(_map(p.get("metadata")).get("name")))
        current = [p for p in owned if _map(_map(p.get("metadata")).get("labels")).get(HASH_LABEL) == comp.template_hash]
        old = [p for p in owned if p not in current]
        deleted: set[str] = set()

        def delete(p: Mapping[str, Any]) -> None:
            pname = str(_map(p.get("metadata")).get("name"))
            plan.deletes.append(pname)
            deleted.add(pname)
            if frees_now:
                sched.release(p)

        # Scale down: surplus pods of the current template go at once, not-ready ones first.
        surplus = len(current) - comp.replicas
        for p in sorted(current, key=lambda p: (_ready(p), str(_map(p.get("metadata")).get("name"))))[:max(0, surplus)]:
            delete(p)
        current = [p for p in current if str(_map(p.get("metadata")).get("name")) not in deleted]
        # Old pods that are not ready serve nothing: remove them now.
        for p in [p for p in old if not _ready(p)]:
            delete(p)
        old = [p for p in old if str(_map(p.get("metadata")).get("name")) not in deleted]
        missing = comp.replicas - len(current)
        if missing > 0:
            # Rolling (old pods still serving): surge one at a time; otherwise create them all.
            rolling = bool(old)
            if not rolling or all(_ready(p) for p in current):
                # A terminating pod keeps its name until it is gone: never reuse it.
                ordinals = _ordinals(current) | _ordinals(
                    [p for p in held if _map(_map(p.get("metadata")).get("labels")).get(LABEL_COMPONENT) == comp.name])
                for _ in range(1 if rolling else missing):
                    ordinal = next(i for i in range(len(ordinals) + 1) if i not in ordinals)
                    ordinals.add(ordinal)
                    pod = _pod_manifest(dgd, comp, ordinal, sched.place(comp.scheduling, comp.gpus),
                                        settings.termination_grace_s)
                    plan.creates.append(pod)
        ready_now = sum(1 for p in current if _ready(p)) + sum(1 for p in old if _ready(p))
        if old and ready_now > comp.replicas:
            delete(old[0])
            old = old[1:]
        for p in current:
            pname = str(_map(p.get("metadata")).get("name"))
            if not _map(p.get("spec")).get("nodeName"):
                placed = sched.place(_map(p.get("spec")), comp.gpus)
                if not isinstance(placed, tuple) and old:
                    # No room to surge: replace in place (one old pod goes first, as a rollout with
                    # maxUnavailable 1 would), so a full cluster can still roll out a new template.
                    delete(old[0])
                    old = old[1:]
                    placed = sched.place(_map(p.get("spec")), comp.gpus)
                if isinstance(placed, tuple):
                    plan.placements[pname] = placed
                continue
            nxt = next_status(p, now, settings.delay_for(comp.name, comp.type))
            if nxt is not None:
                plan.pod_status[pname] = nxt
        ready = sum(1 for p in current if _ready(p))
        done = not old and len(current) == comp.replicas and ready == comp.replicas
        counts.append(ComponentCounts(comp.name, comp.type, len(current) + len(old), len(current),
                                      ready + sum(1 for p in old if _ready(p)), done))
    prev = _map(dgd.get("status"))
    status = render(name, _int(meta.get("generation"), 1), counts, prev, now, keep_foreign=settings.keep_foreign_status)
    plan.dgd_status[name] = status
    all_done = status["state"] == "successful"
    events: list[Event] = []
    if all_done and not was_ready(prev):
        events.append(Event("DynamoGraphDeployment", name, "RolloutCompleted",
                            "every component has its desired replicas ready on the current template"))
    elif was_ready(prev) and not all_done:
        events.append(Event("DynamoGraphDeployment", name, "RolloutStarted",
                            f"generation {status['observedGeneration']}: rolling pods"))
    plan.status_events[name] = events
