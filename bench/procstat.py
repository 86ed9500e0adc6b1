"""A process's CPU seconds and state from /proc (Linux), for the benches."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_state(pid: int) -> str:
    """Its state letter (R, S, Z, ...), or "gone"."""
    try:
        return _stat_fields(pid)[0]
    except OSError:
        return "gone"


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants (a prefork worker's children)."""
    total, todo = 0.0, [pid]
    while todo:
        q = todo.pop()
        try:
            total += proc_cpu_s(q)
            for t in Path(f"/proc/{q}/task").iterdir():
                todo += [int(c) for c in (t / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return total


def children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
