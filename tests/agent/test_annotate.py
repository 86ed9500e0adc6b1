"""Dynamo's enforcement report annotation on each annotated pod, through the official client
against the loopback API server."""

from __future__ import annotations

import json
from pathlib import Path

from powerfleet.agent.annotate import REPORT_ANNOTATION, ReportAnnotator
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.kube import KubeCluster
from powerfleet.twin.apiserver import ApiServer
from tests.agent.conftest import Bench

UID = "aaaaaaaa-0000-4000-8000-00000000000a"
GPU_FIELDS = {"uuid", "requestedWatts", "targetWatts", "constraintMinWatts", "constraintMaxWatts", "policyOutcome",
              "writeOutcome", "readbackOutcome", "enforcedCapWatts", "actuator", "observedAt"}


def test_the_report_appears_on_the_pod_in_dynamos_format_and_is_patched_only_on_change(bench: Bench,
                                                                                      tmp_path: Path) -> None:
    from powerfleet.agent.simulated import write_proc_entry

    with ApiServer() as api:
        api.apply({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "decode-0", "namespace": "llm", "uid": UID,
                                "labels": {"nvidia.com/dynamo-component": "decode"},
                                "annotations": {POWER_ANNOTATION: "300"}},
                   "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "m"}]},
                   "status": {"phase": "Running"}})
        cluster = KubeCluster.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        bench.pods = cluster.list_pods("llm", node_name="node-a")
        write_proc_entry(bench.proc, 101, UID)
        bench.set_pids(0, [101])
        bench.set_pids(1, [101])
        agent = bench.agent()
        annotator = ReportAnnotator(cluster.core, "node-a", bench.clock)
        annotator.publish(agent.run_pass(), agent.last_pods)
        pod = cluster.core.read_namespaced_pod("decode-0", "llm")
        report = json.loads(pod.metadata.annotations[REPORT_ANNOTATION])
        assert (report["version"], report["podUID"], report["node"], report["component"]) == (1, UID, "node-a", "decode")
        assert set(report) == {"version", "dgdUID", "component", "podUID", "node", "allocationID", "gpus"}
        assert [g["uuid"] for g in report["gpus"]] == ["GPU-0000", "GPU-0001"]
        g = report["gpus"][0]
        assert set(g) == GPU_FIELDS
        assert (g["requestedWatts"], g["targetWatts"], g["enforcedCapWatts"], g["writeOutcome"], g["readbackOutcome"],
                g["policyOutcome"], g["constraintMinWatts"], g["constraintMaxWatts"]) == (
                    300, 300, 300, "ok", "match", "single", 200, 700)
        assert pod.metadata.annotations[REPORT_ANNOTATION] == json.dumps(report, sort_keys=True, separators=(",", ":"))
        assert annotator.patches == 1

        # The pod changed since the pass read it (stale resourceVersion): 409, re-read, patched.
        bench.pods[0].annotations[POWER_ANNOTATION] = "250"
        api.apply({**api.get("v1", "Pod", "decode-0", "llm"), "metadata": {
            **api.get("v1", "Pod", "decode-0", "llm")["metadata"], "labels": {"x": "y", "nvidia.com/dynamo-component": "decode"}}})
        annotator.publish(agent.run_pass(), agent.last_pods)
        assert annotator.patches == 2
        assert json.loads(cluster.core.read_namespaced_pod("decode-0", "llm").metadata.annotations[REPORT_ANNOTATION]
                          )["gpus"][0]["targetWatts"] == 250

        annotator.publish(agent.run_pass(), agent.last_pods)  # the cap now holds: writeOutcome "skipped"
        assert annotator.patches == 3
        annotator.publish(agent.run_pass(), agent.last_pods)  # nothing changed: no patch
        assert annotator.patches == 3
        bench.clock.advance(31)
        annotator.publish(agent.run_pass(), agent.last_pods)  # the 30 s refresh
        assert annotator.patches == 4
        cluster.close()
