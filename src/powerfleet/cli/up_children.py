"""`up`'s children die with it, even when `up` itself is killed with SIGKILL.

Each child of `up` runs in a session of its own (so a terminal's Ctrl-C reaches only `up`, which
stops them in order), so nothing else takes them down when `up` is killed without a chance to stop
them: its Redis, worker, agents, beat and Flower went on running, an agent still enforcing caps for
a fleet that no longer exists. On Linux each child asks the kernel for a parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGTERM)``), so it gets SIGTERM, and stops as an operator would stop
it, the moment `up` is gone. Elsewhere nothing changes.

The kernel sends the signal when the *thread* that started the child exits: `up` starts and
restarts every child from its main thread, which lives as long as `up` does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child receive ``sig`` when this process dies; None off Linux.

    Bound here, in the parent, so the child runs only a foreign call and two syscalls between
    fork and exec. A parent that died before the child's prctl took effect would never signal it,
    so the child checks that its parent is still the one that started it.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec
