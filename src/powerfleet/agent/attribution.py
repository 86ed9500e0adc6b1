"""Whose work a GPU's processes are: pods, nobody, or an unknown owner (one pass, one GPU).

``map_pids`` (podmap.py) maps each PID to the pod its cgroup names. What is left over, and the
processes that work on others' behalf, are sorted here:

* **gone**: NVML still lists a PID whose ``/proc`` entry is gone (the process exited), or
  whose cgroup names a pod the agent knows is gone (a terminal phase, or one it saw leave the
  pod view). It counts for nobody.
* **an MPS server** (``nvidia-cuda-mps-server``, by its ``/proc/<pid>/cmdline``; in Kubernetes it
  runs in the device plugin's MPS control-daemon pod, which carries no annotation) works for its
  clients. When the clients are known (the driver lists them: ``nvmlDeviceGetMPSComputeRunningProcesses``,
  each mapped by its own cgroup; or the kubelet allocates the GPU to live pods), the server
  counts for nobody and the GPU is decided over the clients' and the allocation's pods. When
  they are not known (the driver cannot list MPS clients and nothing is allocated), the server
  is a process of an **unknown owner**, whatever pod it runs in.
* **unknown owner**: a host process (a cgroup naming no pod), an unreadable entry, a pod the view
  cannot see (outside ``agent.namespaces``), an MPS server whose clients are not known.

Only PIDs that do not map to an opted-in pod are looked at for an MPS server, so a busy node's
pods cost no extra read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from powerfleet.agent.gpu import GpuReading

MPS_SERVER = "nvidia-cuda-mps-server"
MAX_CMDLINE_BYTES = 4096


def _read_small(path: Path, limit: int) -> bytes | None:
    """A /proc file's first bytes (non-blocking, regular files only), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def is_mps_server(proc_root: str | os.PathLike[str], pid: int) -> bool:
    """True when ``<proc_root>/<pid>/cmdline`` names the MPS server as its program."""
    raw = _read_small(Path(proc_root) / str(int(pid)) / "cmdline", MAX_CMDLINE_BYTES)
    if not raw:
        return False
    argv0 = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    return os.path.basename(argv0) == MPS_SERVER


def exited(proc_root: str | os.PathLike[str], pid: int) -> bool:
    """True when the process has no ``/proc`` entry any more (it exited after NVML listed it)."""
    try:
        os.stat(Path(proc_root) / str(int(pid)))
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False  # there, but unreadable: not known to be gone
    return False


@dataclass(frozen=True)
class Attribution:
    pods: tuple[str, ...]  # distinct pod UIDs whose work is on the GPU (an MPS server's clients included)
    unknown: int  # processes of an unknown owner
    busy: bool  # any process or allocation counts for someone (else the GPU is idle)
    mps: str = ""  # how an MPS server on it was attributed, for the reason ("" without one)


def attribute(r: GpuReading, pid_to_pod: Mapping[int, str], owners: Collection[str],
              annotations: Mapping[str, str], proc_root: str | os.PathLike[str],
              gone: Collection[str], *, blind: bool = False) -> Attribution:
    """One GPU's processes, sorted. ``owners``: the live pods the kubelet allocates it to;
    ``gone``: pod UIDs known to be gone (terminal, or seen leaving the view); ``blind``: the
    proc root shows nothing true (agent/observe.py), so a missing entry proves no exit."""
    pods: set[str] = set()
    unknown = servers = 0
    counted = False
    clients_known = bool(owners) or r.mps_pids is not None
    for pid in r.pids:
        uid = pid_to_pod.get(pid)
        if uid is not None and uid in annotations:
            pods.add(uid)  # an opted-in pod's own process: never an MPS server of someone else's
            counted = True
            continue
        if is_mps_server(proc_root, pid):
            servers += 1
            if not clients_known:
                unknown += 1
                counted = True
            continue
        if uid is not None:
            if uid not in gone:
                pods.add(uid)
                counted = True
        elif blind or not exited(proc_root, pid):
            unknown += 1
            counted = True
    pods |= set(owners)
    mps = ""
    if servers:
        mps = ("MPS server for its clients' pods" if clients_known
               else "MPS server whose clients the driver does not list and no allocation names")
    return Attribution(tuple(sorted(pods)), unknown, counted or bool(owners), mps)
