"""Process -> pod UID from /proc/<pid>/cgroup: every driver, QoS class, cgroup version and runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerfleet.agent.attribution import attribute
from powerfleet.agent.cgroup import pod_uid_for_pid, pod_uid_from_cgroup, pod_uid_from_line
from powerfleet.agent.gpu import GpuReading
from powerfleet.agent.podmap import map_pids

UID = "1f2e3d4c-5b6a-4789-8abc-def012345678"
SYS = UID.replace("-", "_")
CID = "9a8b7c6d5e4f"


def systemd_path(qos: str, scope: str) -> str:
    q = "" if qos == "guaranteed" else f"-{qos}"
    parent = "kubepods.slice" + ("" if qos == "guaranteed" else f"/kubepods{q}.slice")
    return f"/{parent}/kubepods{q}-pod{SYS}.slice/{scope}"


def cgroupfs_path(qos: str, container: str) -> str:
    q = "" if qos == "guaranteed" else f"/{qos}"
    return f"/kubepods{q}/pod{UID}/{container}"


SCOPES = {"containerd": f"cri-containerd-{CID}.scope", "crio": f"crio-{CID}.scope", "docker": f"docker-{CID}.scope"}
QOS = ["guaranteed", "burstable", "besteffort"]


def v1(path: str) -> str:
    # cgroup v1: one line per controller hierarchy, the pod path on each.
    return "\n".join([f"12:cpuset:{path}", f"11:memory:{path}", f"4:cpu,cpuacct:{path}", f"1:name=systemd:{path}",
                      "0::/"]) + "\n"


def v2(path: str) -> str:
    return f"0::{path}\n"


CASES = []
for qos in QOS:
    for runtime, scope in SCOPES.items():
        CASES.append(pytest.param(v1(systemd_path(qos, scope)), id=f"v1-systemd-{qos}-{runtime}"))
        CASES.append(pytest.param(v2(systemd_path(qos, scope)), id=f"v2-systemd-{qos}-{runtime}"))
        # cgroupfs: the runtime names the leaf by the bare container id (docker/containerd) or crio-<id>.
        leaf = f"crio-{CID}" if runtime == "crio" else CID
        CASES.append(pytest.param(v1(cgroupfs_path(qos, leaf)), id=f"v1-cgroupfs-{qos}-{runtime}"))
        CASES.append(pytest.param(v2(cgroupfs_path(qos, leaf)), id=f"v2-cgroupfs-{qos}-{runtime}"))


@pytest.mark.parametrize("text", CASES)
def test_every_driver_qos_version_and_runtime_maps_to_the_api_uid(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


def test_systemd_underscores_become_hyphens_and_case_is_normalised() -> None:
    line = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYS.upper()}.slice/x.scope"
    assert pod_uid_from_line(line) == UID


def test_node_level_prefix_before_kubepods_is_tolerated() -> None:
    text = v2(f"/kubelet.slice/kubelet-kubepods.slice{systemd_path('burstable', SCOPES['containerd'])}")
    assert pod_uid_from_cgroup(text) == UID
    assert pod_uid_from_cgroup(v2(f"/system.slice/containerd.service{cgroupfs_path('besteffort', CID)}")) == UID


@pytest.mark.parametrize("text", [
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "12:memory:/system.slice/nvidia-persistenced.service\n0::/\n",
    "0::/init.scope\n",
    "",
    "0::/kubepods.slice/kubepods-burstable.slice\n",  # the QoS slice itself, no pod
    "0::/kubepods/burstable/podnot-a-uid/abc\n",
])
def test_a_process_outside_kubernetes_maps_to_none(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_first_matching_line_wins() -> None:
    other = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
    text = (f"12:cpuset:/kubepods/burstable/pod{UID}/{CID}\n"
            f"11:memory:/kubepods/besteffort/pod{other}/{CID}\n"
            f"0::/kubepods.slice/kubepods-pod{other.replace('-', '_')}.slice/x.scope\n")
    assert pod_uid_from_cgroup(text) == UID
    assert pod_uid_from_cgroup("0::/\n" + text.splitlines()[1]) == other


def write(proc: Path, pid: int, text: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(text)


def test_unreadable_and_vanished_processes_are_skipped(tmp_path: Path) -> None:
    write(tmp_path, 10, v2(systemd_path("burstable", SCOPES["containerd"])))
    write(tmp_path, 11, "0::/user.slice\n")
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "cgroup").mkdir()  # reading a directory fails: treated as unreadable
    assert pod_uid_for_pid(tmp_path, 99) is None  # vanished
    assert pod_uid_for_pid(tmp_path, 12) is None
    assert map_pids(tmp_path, [10, 11, 12, 99, 10]) == {10: UID}


def test_a_pod_with_many_processes_counts_once(tmp_path: Path) -> None:
    other = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
    r = GpuReading(index=0, uuid="GPU-0", min_mw=1, max_mw=2, default_mw=2, current_mw=2, pids=(1, 2, 3))
    got = attribute(r, {1: UID, 2: UID, 3: other}, set(), {UID: "300"}, tmp_path, gone=())
    assert got.pods == tuple(sorted([UID, other])) and got.unknown == 0, got


@given(st.text(max_size=400))
def test_parser_never_raises_and_returns_a_uid_or_none(text: str) -> None:
    got = pod_uid_from_cgroup(text)
    assert got is None or (len(got) == 36 and got == got.lower() and "_" not in got)


@given(st.uuids(), st.sampled_from(QOS), st.sampled_from(sorted(SCOPES)), st.booleans(), st.booleans())
def test_any_uid_round_trips_through_every_layout(uid, qos, runtime, systemd, version1) -> None:
    u = str(uid)
    if systemd:
        q = "" if qos == "guaranteed" else f"-{qos}"
        path = f"/kubepods.slice/kubepods{q}-pod{u.replace('-', '_')}.slice/{SCOPES[runtime]}"
    else:
        q = "" if qos == "guaranteed" else f"/{qos}"
        path = f"/kubepods{q}/pod{u}/{CID}"
    assert pod_uid_from_cgroup(v1(path) if version1 else v2(path)) == u
