"""The enforcement report on each annotated pod, in Dynamo's version-1 format.

``dynamo.nvidia.com/gpu-power-enforcement-report`` (../shared/research/power_control.md 1.3):
``{version, dgdUID, component, podUID, node, allocationID, gpus: [{uuid, requestedWatts,
targetWatts, constraintMinWatts, constraintMaxWatts, policyOutcome, writeOutcome,
readbackOutcome, enforcedCapWatts, actuator, observedAt}]}``, JSON with sorted keys, at most
64 KiB. A pod's report is patched only when it changed (``observedAt`` aside) or every 30 s,
with the pod's ``uid`` and ``resourceVersion`` as preconditions, retried on 409 up to three
times from a fresh read (the UID must stay the same). ``enforcedCapWatts`` is null when the
write or readback failed. On by default (``agent.enforcement_annotation``). The calls go through
the cluster adapter (``cluster/pod_annotations.py``): pods ``get`` and ``patch``, which the
chart grants beside a ValidatingAdmissionPolicy that lets the agent change only this
annotation, only on pods of its own node.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from collections.abc import Mapping
from typing import Any, Protocol

from powerfleet.agent.report import GpuOutcome, PassReport
from powerfleet.clock import Clock
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo
from powerfleet.cluster.ports import ClusterError, Conflict

log = logging.getLogger("powerfleet.agent")

REPORT_ANNOTATION = "dynamo.nvidia.com/gpu-power-enforcement-report"
REPORT_VERSION = 1
MAX_REPORT_BYTES = 64 * 1024
REFRESH_S = 30.0
CONFLICT_RETRIES = 3
COMPONENT_LABEL = "nvidia.com/dynamo-component"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def gpu_entry(g: GpuOutcome, at: float) -> dict[str, Any]:
    enforced = g.enforced_w if g.write != "failed" and g.readback in ("match", "skipped") else None
    return {"uuid": g.uuid, "requestedWatts": g.requested_w, "targetWatts": g.cap_w,
            "constraintMinWatts": g.min_w, "constraintMaxWatts": g.max_w, "policyOutcome": g.decision,
            "writeOutcome": g.write, "readbackOutcome": g.readback, "enforcedCapWatts": enforced,
            "actuator": "nvml", "observedAt": _iso(at)}


def pod_report(node: str, pod: PodInfo, gpus: list[GpuOutcome], at: float) -> dict[str, Any]:
    return {"version": REPORT_VERSION, "dgdUID": pod.labels.get("nvidia.com/dynamo-graph-deployment-uid", ""),
            "component": pod.labels.get(COMPONENT_LABEL, ""), "podUID": pod.uid, "node": node, "allocationID": "",
            "gpus": [gpu_entry(g, at) for g in sorted(gpus, key=lambda g: g.uuid or "")]}


def encode(report: dict[str, Any]) -> str:
    text = json.dumps(report, sort_keys=True, separators=(",", ":"))
    if len(text.encode()) > MAX_REPORT_BYTES:
        raise ValueError(f"enforcement report of pod {report.get('podUID')} is over {MAX_REPORT_BYTES} bytes")
    return text


def _semantic(report: dict[str, Any]) -> str:
    return json.dumps({**report, "gpus": [{k: v for k, v in g.items() if k != "observedAt"} for g in report["gpus"]]},
                      sort_keys=True)


class PodAnnotations(Protocol):
    """``cluster.pod_annotations.KubePodAnnotations``: the agent's only pod writes."""

    def get_pod(self, namespace: str, name: str) -> PodInfo: ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None], *, uid: str,
                              resource_version: str | None = None) -> PodInfo: ...


class ReportAnnotator:
    def __init__(self, pods: PodAnnotations, node: str, clock: Clock) -> None:
        self.pods, self.node, self.clock = pods, node, clock
        self._sent: dict[str, tuple[str, float]] = {}  # pod uid -> (semantic report, monotonic time)
        self.patches = 0

    def publish(self, report: PassReport, pods: dict[str, PodInfo]) -> None:
        """Patch the report onto every annotated pod the pass saw on a GPU."""
        if report.dry_run or report.skipped:
            return
        by_pod: dict[str, list[GpuOutcome]] = {}
        for g in report.gpus:
            for uid in g.pods:
                pod = pods.get(uid)
                if pod is not None and POWER_ANNOTATION in pod.annotations and g.uuid:
                    by_pod.setdefault(uid, []).append(g)
        for uid, gpus in by_pod.items():
            doc = pod_report(self.node, pods[uid], gpus, report.at)
            semantic, now = _semantic(doc), self.clock.monotonic()
            last = self._sent.get(uid)
            if last is not None and last[0] == semantic and now - last[1] < REFRESH_S:
                continue
            try:
                self._patch(pods[uid], encode(doc))
                self._sent[uid] = (semantic, now)
            except (ClusterError, ValueError) as exc:
                log.warning("pod %s/%s: enforcement report not written (%s)", pods[uid].namespace, pods[uid].name,
                            str(exc).splitlines()[0][:200])
        for gone in [u for u in self._sent if u not in pods]:
            del self._sent[gone]

    def _patch(self, pod: PodInfo, text: str) -> None:
        version = pod.resource_version
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                self.pods.patch_pod_annotations(pod.namespace, pod.name, {REPORT_ANNOTATION: text}, uid=pod.uid,
                                                resource_version=version)
                self.patches += 1
                return
            except Conflict:
                if attempt == CONFLICT_RETRIES:
                    raise
            fresh = self.pods.get_pod(pod.namespace, pod.name)
            if fresh.uid != pod.uid:
                raise Conflict(f"pod {pod.namespace}/{pod.name} was replaced (its UID changed)", status=409)
            version = fresh.resource_version
