"""`powerfleet twin` in the foreground: a kubeconfig the official client can use, live frontends, clean stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from kubernetes import client, config

from tests.waiting import wait_for


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("POWERFLEET_")}


def test_twin_runs_in_the_foreground_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    root = tmp_path / "twin"
    proc = subprocess.Popen([sys.executable, "-m", "powerfleet.cli", "twin", "--nodes", "1", "--dir", str(root)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        manifest = wait_for(lambda: (m := json.loads((root / "twin.json").read_text())) and len(m["frontends"]) == 2
                            and m, "the twin's two frontends", timeout_s=60)
        api = config.new_client_from_config(config_file=manifest["kubeconfig"])
        nodes = client.CoreV1Api(api).list_node().items
        assert [n.metadata.labels["powerfleet.io/rack"] for n in nodes] == ["rack-a"]
        for fe in manifest["frontends"].values():
            assert httpx.get(fe["router_url"] + "/router_policy", timeout=5).json()["revision"] == 0
        pods = client.CoreV1Api(api).list_namespaced_pod("default").items
        fronts = [p for p in pods if p.metadata.labels["nvidia.com/dynamo-component"] == "frontend"]
        assert {p.metadata.annotations["powerfleet.nvidia.com/router-url"] for p in fronts} == \
            {fe["router_url"] for fe in manifest["frontends"].values()}
        api.close()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert f"kubeconfig: {manifest['kubeconfig']}" in out and "Traceback" not in err


def test_twin_refuses_bad_options(tmp_path: Path) -> None:
    missing = subprocess.run([sys.executable, "-m", "powerfleet.cli", "twin", "--traces", str(tmp_path / "nope")],
                             env=_env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--traces" in missing.stderr and "Traceback" not in missing.stderr
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    bad_dir = subprocess.run([sys.executable, "-m", "powerfleet.cli", "twin", "--dir", str(blocked / "x")],
                             env=_env(), capture_output=True, text=True, timeout=60)
    assert bad_dir.returncode == 1 and "cannot start" in bad_dir.stderr and "Traceback" not in bad_dir.stderr
