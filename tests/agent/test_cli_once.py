"""`powerfleet agent once --dry-run --json` through the installed console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.agent.simulated import write_proc_entry
from powerfleet.agent.state import parse_state
from powerfleet.cluster.dgd import POWER_ANNOTATION
from tests.agent.conftest import device

POWERFLEET = str(Path(sys.executable).with_name("powerfleet"))
A, B, C = ("aaaaaaaa-0000-4000-8000-00000000000a", "bbbbbbbb-0000-4000-8000-00000000000b",
           "cccccccc-0000-4000-8000-00000000000c")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "POWERFLEET_AGENT__STATE_DIR": "/nonexistent-state",
           **{k: os.environ[k] for k in ("PYTHONPATH", "POWERFLEET_INPUT_TIMEOUT_S") if k in os.environ}}  # the tree under test
    return subprocess.run([POWERFLEET, "agent", "once", *args], capture_output=True, text=True, timeout=60, env=env)


def podlist(*pods: tuple[str, str, str | None, str]) -> dict:
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": ns, "uid": uid, "annotations": {} if cap is None else {POWER_ANNOTATION: cap}},
         "spec": {"nodeName": "gpu-a"}, "status": {"phase": "Running"}} for name, uid, cap, ns in pods]}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    for pid, uid in ((11, A), (12, A), (21, B), (22, C), (31, C)):
        write_proc_entry(proc, pid, uid)
    write_proc_entry(proc, 999, None, program="/usr/bin/dcgm-host")  # a host process, outside Kubernetes
    (tmp_path / "pods.json").write_text(json.dumps(podlist(("a", A, "300", "llm"), ("b", B, "350", "llm"),
                                                           ("c", C, "900", "other"))))
    gpus = [device(0, pids=[11, 12]), device(1, pids=[21, 22]), device(2), device(3, pids=[31]),
            device(4, pids=[999])]
    (tmp_path / "gpus.json").write_text(json.dumps(gpus))
    return tmp_path


def test_dry_run_prints_what_the_agent_would_do_per_gpu(node: Path) -> None:
    res = run("--node", "gpu-a", "--proc-root", str(node / "proc"), "--pods", str(node / "pods.json"),
              "--gpus", str(node / "gpus.json"), "--safe-default-watts", "450", "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["skipped"] is None and out["dry_run"] is True
    rows = {g["index"]: (g["decision"], g["pods"], g["requested_w"], g["cap_w"]) for g in out["gpus"]}
    assert rows == {
        0: ("single", [A], 300, 300),            # two processes, one pod
        1: ("conflict", sorted([B, C]), 350, 350),  # the lowest valid cap, never the higher safe default
        2: ("idle", [], None, None),
        3: ("single", [C], 900, 700),            # clamped to max
        4: ("safe_default", [], 450, 450),       # a host process: an unknown owner, safe by default
    }
    assert [g["uuid"] for g in out["gpus"]] == [f"GPU-{i:04d}" for i in range(5)]
    assert json.loads((node / "gpus.json").read_text())[0]["current_w"] == 700  # touched nothing


def test_namespace_scope(node: Path) -> None:
    res = run("--node", "gpu-a", "--proc-root", str(node / "proc"), "--pods", str(node / "pods.json"),
              "--gpus", str(node / "gpus.json"), "--namespace", "llm", "--dry-run", "--json")
    rows = {g["index"]: g["decision"] for g in json.loads(res.stdout)["gpus"]}
    assert rows[1] == "conflict" and rows[3] == "safe_default"  # c is out of scope: an unknown owner


def test_a_pass_that_cannot_list_pods_says_skipped_and_exits_1(node: Path, tmp_path: Path) -> None:
    env_kube = tmp_path / "missing-kubeconfig"
    res = subprocess.run([POWERFLEET, "agent", "once", "--node", "gpu-a", "--gpus", str(node / "gpus.json"),
                          "--dry-run", "--json"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "POWERFLEET_AGENT__KUBECONFIG": str(env_kube)})
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["skipped"].startswith("pod list failed: no cluster access") and out["gpus"] == []
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args,msg", [
    (["--node", "Bad Node"], "--node: 'Bad Node' is not a valid Kubernetes node name"),
    (["--node", "gpu-a", "--pods", "/nope.json"], "--pods: cannot read /nope.json (No such file or directory)"),
    (["--node", "gpu-a", "--pods", "{gpus}"], "--pods: {gpus}: items[0]: not a Pod (kind None, metadata.name None)"),
    (["--node", "gpu-a", "--gpus", "{pods}"], "--gpus: {pods}: expected a JSON list of GPUs, got dict"),
    (["--node", "gpu-a", "--gpus", "{bin}"], "--gpus: {bin} is not UTF-8 text"),
    (["--node", "gpu-a", "--gpus", "{bad}"], "--gpus: {bad}: GPU [0]: min_w: Input should be greater than 0"),
])
def test_bad_input_is_one_line_and_exit_2(node: Path, args: list[str], msg: str) -> None:
    (node / "bin.json").write_bytes(b"\xff\xfe\x00")
    (node / "bad.json").write_text(json.dumps([device(0, min_w=0)]))
    paths = {"gpus": node / "gpus.json", "pods": node / "pods.json", "bin": node / "bin.json", "bad": node / "bad.json"}
    args = [a.format(**paths) for a in args]
    res = run(*args, "--dry-run", "--json")
    assert res.returncode == 2
    assert res.stderr.strip() == "powerfleet: error: " + msg.format(**paths)


def test_without_dry_run_the_pass_is_real_and_records_what_it_manages(node: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    res = run("--node", "gpu-a", "--proc-root", str(node / "proc"), "--pods", str(node / "pods.json"),
              "--gpus", str(node / "gpus.json"), "--state-dir", str(state), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["schema"] == "powerfleet.agent.once/v1" and out["dry_run"] is False
    assert {g["index"]: g["action"] for g in out["gpus"]} == {0: "set", 1: "set", 2: "none", 3: "hold", 4: "set"}
    # GPU 3 already held its clamped cap; GPU 4 (a host process) took the safe default
    assert out["managed"] == ["GPU-0000", "GPU-0001", "GPU-0003", "GPU-0004"]
    assert json.loads((state / "managed_gpus.json").read_text())["managed_uuids"] == out["managed"]
    loaded = parse_state((state / "managed_gpus.json").read_text())
    assert sorted(loaded.uuids) == out["managed"] and loaded.record.targets == {
        "GPU-0000": 300_000, "GPU-0001": 350_000, "GPU-0003": 700_000, "GPU-0004": 490_000}, loaded


def test_human_output_names_each_gpu_decision_and_cap(node: Path) -> None:
    res = run("--node", "gpu-a", "--proc-root", str(node / "proc"), "--pods", str(node / "pods.json"),
              "--gpus", str(node / "gpus.json"), "--dry-run")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "gpu-a: dry run, 5 GPU(s)"
    assert "GPU 3 GPU-0003: single" in lines[4] and "requested 900 -> cap 700 W (clamped to max) [hold]" in lines[4]
    assert "GPU 0 GPU-0000: single" in lines[1] and "requested 300 -> cap 300 W [would-set]" in lines[1]


def test_hostile_files_fail_in_one_line(node: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    import os

    # A FIFO is read like <(kubectl ...) (textinput.py), within this many seconds: one with no writer fails.
    monkeypatch.setenv("POWERFLEET_INPUT_TIMEOUT_S", "1")
    import typer

    from powerfleet.agent.simulated import parse_devices
    from powerfleet.cli.agent_cmd import _read_json

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "inf.json").write_text('[{"index": 0, "uuid": "GPU-0", "min_w": Infinity, "max_w": 700, "default_w": 700}]')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    for path, msg in [(fifo, "gave no end of input within 1 s"), (Path("/dev/zero"), "is not a regular file"),
                      (tmp_path / "inf.json", "Infinity is not a number JSON allows"),
                      (tmp_path / "deep.json", "nested too deeply")]:
        with pytest.raises(typer.Exit) as exit_:
            _read_json(path, "--gpus")  # in-process: the reader every --pods/--gpus file goes through
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.exit_code == 2 and len(err) == 1 and msg in err[0], (path, err)
    with pytest.raises(ValueError, match="min_w"):
        parse_devices([{**device(0), "min_w": True}])
    # And once through the installed command: a FIFO as --pods fails in one line, nothing hangs.
    res = run("--node", "gpu-a", "--pods", str(fifo), "--dry-run", "--json")
    assert res.returncode == 2 and res.stderr.strip().startswith(f"powerfleet: error: --pods: {fifo} gave no end of input"), res.stderr


def test_a_fifo_as_a_cgroup_file_is_skipped_not_waited_on(node: Path) -> None:
    import os

    from powerfleet.agent.cgroup import pod_uid_for_pid

    (node / "proc" / "77").mkdir()
    os.mkfifo(node / "proc" / "77" / "cgroup")
    assert pod_uid_for_pid(node / "proc", 77) is None


def grpcurl_list(*entries: tuple[str, str, list[str]]) -> dict:
    """What `grpcurl ... v1.PodResourcesLister/List` prints (protobuf JSON, camelCase)."""
    return {"podResources": [{"name": pod, "namespace": ns, "containers": [
        {"name": "main", "devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": ids}]}]} for pod, ns, ids in entries]}


def test_allocations_from_a_file_decide_an_idle_gpu_and_bad_files_fail_in_one_line(node: Path) -> None:
    """Issue 32 item 8: `agent once --allocations FILE` replays what the kubelet says."""
    (node / "alloc.json").write_text(json.dumps(grpcurl_list(("a", "llm", ["GPU-0002"]), ("b", "llm", ["4"]))))
    res = run("--node", "gpu-a", "--proc-root", str(node / "proc"), "--pods", str(node / "pods.json"),
              "--gpus", str(node / "gpus.json"), "--allocations", str(node / "alloc.json"), "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    rows = {g["index"]: (g["decision"], g["pods"], g["cap_w"]) for g in json.loads(res.stdout)["gpus"]}
    assert rows[2] == ("single", [A], 300) and rows[4][0] == "conflict", rows  # an index ID maps to GPU 4
    (node / "bad.json").write_text(json.dumps({"podResources": [{"name": "a", "containerz": []}]}))
    res = run("--node", "gpu-a", "--pods", str(node / "pods.json"), "--gpus", str(node / "gpus.json"),
              "--allocations", str(node / "bad.json"), "--dry-run")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "containerz" in res.stderr, res


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["podResources", "name", "namespace", "containers", "devices", "resourceName",
                                         "deviceIds", "x"]), inner, max_size=3), max_leaves=12))
def test_the_allocations_parser_accepts_or_refuses_in_one_line(data) -> None:
    from powerfleet.agent.offline import allocations_from_json

    try:
        got = allocations_from_json(data)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert all(isinstance(k, str) and k for k in got)
