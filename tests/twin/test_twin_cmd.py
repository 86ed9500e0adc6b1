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

from tests.envs import subprocess_env
from tests.waiting import wait_for


def _env() -> dict[str, str]:
    return subprocess_env()


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
        _second_twin_on_the_same_dir_is_refused(root)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert f"kubeconfig: {manifest['kubeconfig']}" in out and "Traceback" not in err
    _exports_are_accepted_by_a_shell_and_configure_a_fleet(out, manifest)


def _second_twin_on_the_same_dir_is_refused(root: Path) -> None:
    before = (root / "twin.json").read_text()
    second = subprocess.run([sys.executable, "-m", "powerfleet.cli", "twin", "--nodes", "1", "--dir", str(root)],
                            env=_env(), capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and "is in use by another twin" in second.stderr, second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert (root / "twin.json").read_text() == before  # the running twin's files are untouched


def _exports_are_accepted_by_a_shell_and_configure_a_fleet(out: str, manifest: dict) -> None:
    from powerfleet.config import load_config

    exports = [line for line in out.splitlines() if line.startswith("export ")]
    script = "set -e\n" + "\n".join(exports) + "\nenv\n"
    shell = subprocess.run(["sh", "-c", script], env=_env(), capture_output=True, text=True, timeout=30)
    assert shell.returncode == 0, shell.stderr
    env = dict(line.split("=", 1) for line in shell.stdout.splitlines() if line.startswith(("POWERFLEET_", "KUBECONFIG=")))
    cfg = load_config(environ=env)
    assert cfg.nodes == ["twin-gpu-00"]
    assert cfg.agent.kubeconfig == cfg.budget.kubeconfig == cfg.retune.kubeconfig == manifest["kubeconfig"]
    assert set(cfg.retune.deployments) == {"llm-disagg", "llm-agg"}
    assert cfg.retune.window_interval_s == 20  # the twin's own window (--window), not 300 s
    assert {d.split("/")[1] for d in cfg.budget.deployments} == {"llm-disagg", "llm-agg"}
    assert cfg.budget.groups and cfg.beat.budget_interval_s <= 5


def test_twin_refuses_bad_options(tmp_path: Path) -> None:
    missing = subprocess.run([sys.executable, "-m", "powerfleet.cli", "twin", "--traces", str(tmp_path / "nope")],
                             env=_env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--traces" in missing.stderr and "Traceback" not in missing.stderr
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    bad_dir = subprocess.run([sys.executable, "-m", "powerfleet.cli", "twin", "--dir", str(blocked / "x")],
                             env=_env(), capture_output=True, text=True, timeout=60)
    assert bad_dir.returncode == 1 and "cannot start" in bad_dir.stderr and "Traceback" not in bad_dir.stderr
