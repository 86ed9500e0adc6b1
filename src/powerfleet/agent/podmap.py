"""GPU processes -> pods, and pods -> their power annotation, for one pass."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from powerfleet.agent.cgroup import pod_uid_for_pid
from powerfleet.cluster.dgd import POWER_ANNOTATION
from powerfleet.cluster.objects import PodInfo


def map_pids(proc_root: str | os.PathLike[str], pids: Iterable[int]) -> dict[int, str]:
    """pid -> pod UID for the pids that belong to a pod; others (host processes, gone) are left out."""
    out: dict[int, str] = {}
    for pid in set(pids):
        uid = pod_uid_for_pid(proc_root, pid)
        if uid is not None:
            out[pid] = uid
    return out


def annotations_by_uid(pods: Iterable[PodInfo]) -> dict[str, str]:
    """Pod UID -> raw power annotation, for the pods that carry the key.

    A pod with the key but a malformed value stays in the map: the policy turns it into the
    safe default rather than ignoring it. A pod without the key is absent (not opted in).
    """
    return {pod.uid.lower(): pod.annotations[POWER_ANNOTATION]
            for pod in pods if pod.uid and POWER_ANNOTATION in pod.annotations}


def proc_root_problem(proc_root: str | os.PathLike[str]) -> str | None:
    """Why ``proc_root`` cannot show the host's processes, or None. Checked at start and every
    pass: a missing or empty root (a wrong mount) would make every GPU process look
    unattributable, and a container's own /proc (PID 1 in a pod's cgroup) shows only that pod."""
    root = os.fspath(proc_root)
    try:
        entries = os.listdir(root)
    except OSError as exc:
        return f"proc root {root} cannot be listed ({exc.strerror or exc}); mount the host's /proc or use hostPID"
    if not any(e.isdigit() for e in entries):
        return f"proc root {root} shows no processes; mount the host's /proc or use hostPID"
    init_pod = pod_uid_for_pid(proc_root, 1) if "1" in entries else None
    if init_pod is not None:  # a container's own /proc: its PID 1 is the container's entrypoint
        return (f"proc root {root} is a container's (its PID 1 is in pod {init_pod}), not the host's; "
                "mount the host's /proc or use hostPID")
    return None


def visible(proc_root: str | os.PathLike[str], pids: Iterable[int]) -> set[int]:
    """The pids that exist under ``proc_root`` (NVML reports host PIDs)."""
    return {p for p in set(pids) if os.path.isdir(os.path.join(os.fspath(proc_root), str(int(p))))}
