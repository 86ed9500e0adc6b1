"""The twin on the real control plane (issue 34 item 6): ``Twin(..., server=RealApiServer)`` and
``powerfleet demo --control-plane real``: the twin's operator, GPUs, frontends and traffic against
etcd + kube-apiserver v1.37.2 of their own (started and stopped by the twin, beside the tier's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client, config

from powerfleet.testing.controlplane import ControlPlane
from powerfleet.testing.controlplane.twin_api import RealApiServer
from powerfleet.twin.fidelity import demo_operator_settings
from powerfleet.twin.runtime import Twin, TwinOptions
from powerfleet.twin.cluster.topology import TwinSpec
from tests.waiting import wait_for

# The default scenario's checks (tests/integration/test_up_and_demo.py asserts the same on the loopback twin).
DEMO_CHECKS = {"power_within_budget", "no_rack_over_limit", "caps_match_annotations", "retune_windows_decided",
               "no_unexpected_task_failures", "slo", "cap_change", "follow_load_disagg", "follow_load_agg",
               "retune_applied", "manual_change_reverted"}


def _phase(pod: dict) -> str:  # type: ignore[type-arg]
    return str((pod.get("status") or {}).get("phase"))


def test_the_twins_pods_run_and_its_frontends_start_on_the_real_server(control_plane: ControlPlane,
                                                                        tmp_path: Path) -> None:
    server = RealApiServer(control_plane.bin_dir, tmp_path / "control-plane")
    twin = Twin(TwinOptions(spec=TwinSpec(nodes=2), root=tmp_path / "twin", operator=demo_operator_settings(60)),
                server=server)
    twin.start()
    try:
        api = config.new_client_from_config(config_file=str(twin.kubeconfig))
        try:
            assert client.VersionApi(api).get_code().git_version == "v1.37.2"  # not the loopback server
            core = client.CoreV1Api(api)
            wait_for(lambda: len(twin.frontends) == len(twin.sources), "a frontend per deployment", timeout_s=90)
            # Every pod the operator made runs (the tenant `queued-train` waits for room, as designed).
            wait_for(lambda: all(p.status.phase == "Running" for p in core.list_namespaced_pod(twin.spec.namespace).items
                                 if p.metadata.name != "queued-train"), "the operator's pods Running", timeout_s=90)
            # A frontend starts before its pod is annotated with its URL: wait for the annotations
            # (under load the second one came after the first read).
            def fronted() -> set[str]:
                return {p.metadata.name for p in core.list_namespaced_pod(twin.spec.namespace).items
                        if (p.metadata.annotations or {}).get("powerfleet.nvidia.com/router-url")}
            wait_for(lambda: fronted() == set(twin.frontends), "every frontend's pod annotated with its URL",
                     timeout_s=60)
            assert twin.operator is not None and twin.operator.last_error is None, twin.operator.last_error
        finally:
            api.close()
        wait_for(lambda: len(twin.snapshot_samples()) >= 3, "three twin ticks", timeout_s=30)
        assert twin.tick_errors == 0, twin.last_tick_error
    finally:
        twin.stop()
    assert server.plane.running() == [], f"programs left running: {server.plane.running()}"
    # Read after the stop from what the server held (the demo judges after its twin stopped).
    assert {_phase(p) for p in twin.api.list("v1", "Pod", twin.spec.namespace)} >= {"Running"}


@pytest.mark.timeout(600)
def test_a_short_demo_on_the_real_control_plane_holds_every_check(control_plane: ControlPlane,
                                                                   tmp_path: Path) -> None:
    """120 s with 20 s windows: the manual change waits for a retune to apply, then for its revert
    (a 10 s retune tick); 60 s left one run without that revert, and 10 s windows leave a shard 6 s,
    which a loaded machine overran."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERFLEET_")}
    env["PF_CONTROL_PLANE_BIN"] = str(control_plane.bin_dir)
    report = tmp_path / "report"
    out = subprocess.run([sys.executable, "-m", "powerfleet.cli", "demo", "--control-plane", "real",
                          "--duration", "120", "--window", "20", "--nodes", "2", "--plain", "--report", str(report), "--json"],
                         env=env, capture_output=True, text=True, timeout=560)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    summary = json.loads(out.stdout) if out.stdout.strip() else {}
    failed = sorted(name for name, ok in summary.get("checks", {}).items() if not ok)
    assert out.returncode == 0 and failed == [], (out.returncode, failed, out.stderr[-3000:])
    assert summary["control_plane"] == "real" and set(summary["checks"]) >= DEMO_CHECKS, summary["checks"]
