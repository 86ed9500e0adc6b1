"""Process -> pod: the pod UID in ``/proc/<pid>/cgroup``.

Kubelet puts every container in a cgroup under its pod's cgroup. Shapes seen in the wild
(v1 has one line per controller, v2 a single ``0::`` line):

* systemd driver: ``.../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope``; the uid has ``_`` where the API has ``-`` (systemd reserves ``-``
  for nesting). Guaranteed pods have no QoS part: ``kubepods-pod<uid>.slice``.
* cgroupfs driver: ``.../kubepods/besteffort/pod<uid>/<container id>`` (Guaranteed: ``/kubepods/pod<uid>/``).
* container runtime wrappers: ``cri-containerd-``, ``crio-``, ``docker-`` scopes, or a bare id; a
  node-level prefix (``/system.slice/...``, ``/kubelet.slice/...``) may come first.

Lines are tried in file order and the first that names a pod wins. A process outside
Kubernetes has no such line and maps to None.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

_SYSTEMD = re.compile(r"kubepods(?:-burstable|-besteffort)?-pod([0-9a-fA-F_]+)\.slice")
_CGROUPFS = re.compile(r"/kubepods(?:/burstable|/besteffort)?/pod([0-9a-fA-F-]+)(?:/|$)")
_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MAX_CGROUP_BYTES = 64 * 1024  # a real file is a few hundred bytes; never read an unbounded one


def pod_uid_from_line(line: str) -> str | None:
    """The pod UID one cgroup line names, in the API's form (lower case, hyphens), or None."""
    # The path is the third field; a v1 controller list may contain ':' only in field 2.
    path = line.split(":", 2)[2] if line.count(":") >= 2 else line
    m = _SYSTEMD.search(path)
    raw = m.group(1).replace("_", "-") if m else None
    if raw is None:
        m = _CGROUPFS.search(path)
        raw = m.group(1) if m else None
    if raw is None:
        return None
    uid = raw.lower()
    return uid if _UID.match(uid) else None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The first pod UID named by any line of a cgroup file, or None (not a Kubernetes process)."""
    for line in text.splitlines():
        uid = pod_uid_from_line(line.strip())
        if uid is not None:
            return uid
    return None


def pod_uid_for_pid(proc_root: str | os.PathLike[str], pid: int) -> str | None:
    """Read ``<proc_root>/<pid>/cgroup``; None when unreadable, vanished, or not in a pod."""
    try:
        # O_NONBLOCK and a regular-file check: a FIFO or device planted there must not hang the pass.
        fd = os.open(Path(proc_root) / str(int(pid)) / "cgroup", os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None  # the process exited, or /proc is not mounted as expected: skip it
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_CGROUP_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return pod_uid_from_cgroup(data.decode("utf-8", errors="replace"))
