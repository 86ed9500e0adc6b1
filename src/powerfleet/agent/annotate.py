"""The enforcement report on each annotated pod, in Dynamo's version-1 format.

``dynamo.nvidia.com/gpu-power-enforcement-report`` (../shared/research/power_control.md 1.3):
``{version, dgdUID, component, podUID, node, allocationID, gpus: [{uuid, requestedWatts,
targetWatts, constraintMinWatts, constraintMaxWatts, policyOutcome, writeOutcome,
readbackOutcome, enforcedCapWatts, actuator, observedAt}]}``, JSON with sorted keys, at most
64 KiB. A pod's report is patched only when it changed (``observedAt`` aside) or every 30 s,
with the pod's ``uid`` and ``resourceVersion`` as preconditions, retried on 409 up to three
times from a fresh read (the UID must stay the same). ``enforcedCapWatts`` is null when the
write or readback failed. Off by default (``agent.enforcement_annotation``): it needs ``get``
and ``patch`` on pods, which the chart's RBAC does not grant yet.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from powerfleet.agent.report import GpuOutcome, PassReport
from powerfleet.clock import Clock
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo

log = logging.getLogger("powerfleet.agent")

REPORT_ANNOTATION = "dynamo.nvidia.com/gpu-power-enforcement-report"
REPORT_VERSION = 1
MAX_REPORT_BYTES = 64 * 1024
REFRESH_S = 30.0
CONFLICT_RETRIES = 3
PATCH_TIMEOUT_S = 5.0
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


class ReportAnnotator:
    def __init__(self, core: client.CoreV1Api, node: str, clock: Clock) -> None:
        self.core, self.node, self.clock = core, node, clock
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
            except (ApiException, ValueError, OSError) as exc:
                log.warning("pod %s/%s: enforcement report not written (%s)", pods[uid].namespace, pods[uid].name,
                            getattr(exc, "status", None) or str(exc).splitlines()[0])
        for gone in [u for u in self._sent if u not in pods]:
            del self._sent[gone]

    def _patch(self, pod: PodInfo, text: str) -> None:
        version = pod.resource_version
        for attempt in range(CONFLICT_RETRIES + 1):
            body = {"metadata": {"uid": pod.uid, "resourceVersion": version, "annotations": {REPORT_ANNOTATION: text}}}
            try:
                self.core.patch_namespaced_pod(pod.name, pod.namespace, body, _request_timeout=PATCH_TIMEOUT_S)
                self.patches += 1
                return
            except ApiException as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES:
                    raise
            fresh = self.core.read_namespaced_pod(pod.name, pod.namespace, _request_timeout=PATCH_TIMEOUT_S)
            if fresh.metadata.uid != pod.uid:
                raise ApiException(status=409, reason="the pod was replaced (its UID changed)")
            version = fresh.metadata.resource_version
