"""An agent killed with SIGKILL while its caps are applied, then restarted (real `powerfleet agent`
processes, real Redis, the loopback API server, simulated GPUs shared by file with the test).

SIGKILL skips the shutdown restore, so the caps stay on the GPUs and the managed set stays in
the state file. While the agent is dead the world moves on: one GPU's process exits (an idle
orphan) and the other pod's cap annotation changes. The restarted agent restores the idle orphan
to its default at startup and reconciles the busy GPU to the new cap in its first pass.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from powerfleet.agent.simulated import SimulatedGpus, write_proc_entry
from powerfleet.agent.state import STATE_FILE
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.testing.waiting import wait_for
from powerfleet.workers.launcher import Launcher
from tests.agent.conftest import device

pytestmark = pytest.mark.integration

NODE = "gpu-node-k"
UIDS = ("aaaaaaaa-0000-4000-8000-0000000000a1", "bbbbbbbb-0000-4000-8000-0000000000b2")
PIDS = (4242, 4343)


def pod(i: int, cap: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"decode-{i}", "namespace": "llm", "uid": UIDS[i], "annotations": {POWER_ANNOTATION: cap}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "m"}]},
            "status": {"phase": "Running"}}


def test_a_killed_agent_restores_idle_orphans_and_reconciles_busy_gpus_on_restart(tmp_path: Path,
                                                                                  broker_url: str) -> None:
    from powerfleet.twin.apiserver import ApiServer

    with ApiServer() as api:
        api.apply(pod(0, "300"))
        api.apply(pod(1, "350"))
        for pid, uid in zip(PIDS, UIDS):
            write_proc_entry(tmp_path / "proc", pid, uid)
        gpus = SimulatedGpus.shared(tmp_path / "sim" / f"{NODE}.json",
                                    [device(0, pids=[PIDS[0]]), device(1, pids=[PIDS[1]])])
        env = {"POWERFLEET_BROKER__URL": broker_url, "POWERFLEET_BEAT__RECONCILE_INTERVAL_S": "60",
               "POWERFLEET_AGENT__GPU_BACKEND": "simulated", "POWERFLEET_AGENT__SIMULATED_DIR": str(tmp_path / "sim"),
               "POWERFLEET_AGENT__KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
               "POWERFLEET_AGENT__STATE_DIR": str(tmp_path / "state"), "POWERFLEET_AGENT__PROC_ROOT": str(tmp_path / "proc"),
               "POWERFLEET_AGENT__NAMESPACES": "[llm]"}
        limits = lambda: [d.current_w for d in gpus.devices()]
        with Launcher(log_dir=tmp_path / "logs", env=env) as launcher:
            first = launcher.spawn("agent-1", "agent", "--node", NODE)
            wait_for(lambda: limits() == [300, 350], "the first agent to cap both GPUs", 60)
            state_file = tmp_path / "state" / NODE / STATE_FILE
            managed = lambda: json.loads(state_file.read_text())["managed_uuids"]
            wait_for(lambda: managed() == ["GPU-0000", "GPU-0001"], "both GPUs recorded as managed")
            first.proc.send_signal(signal.SIGKILL)
            assert first.proc.wait(timeout=30) == -signal.SIGKILL
            assert limits() == [300, 350]  # no shutdown restore: the caps are orphaned

            # While no agent runs: GPU 1's process exits (idle orphan); pod 0's cap changes.
            def gpu1_idle(devs: list[Any]) -> None:
                devs[1].pids = []
            gpus.update(gpu1_idle)
            api.delete("v1", "Pod", "decode-1", "llm")
            api.apply(pod(0, "280"))

            second = launcher.spawn("agent-2", "agent", "--node", NODE)
            wait_for(lambda: limits() == [280, 700], "the restarted agent to restore GPU 1 and cap GPU 0 at 280", 60)
            # GPU 1: idle and its pod is gone from the pod view, so its cap goes (startup recovery).
            # The line is logged just after the set: wait for it (under load it came after the limits).
            wait_for(lambda: "GPU 1 (GPU-0001): 350 W -> 700 W (release)" in second.log.read_text(),
                     "the restarted agent to log GPU 1's release")
            wait_for(lambda: managed() == ["GPU-0000"],
                     "only the busy GPU still managed")
            # Celery installs its SIGTERM handler when the worker is ready; a signal before that is no warm stop.
            wait_for(lambda: f"agent@{NODE} ready." in second.log.read_text(), "the second agent's worker to be ready", 60)
            assert launcher.stop_child(second) == 0  # and a clean stop (no drain) leaves the cap for the next agent
            assert limits() == [280, 700]
            assert "Traceback" not in second.log.read_text()
