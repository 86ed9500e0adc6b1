"""Atomic file replacement for the agent's files (state, simulated GPUs)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with ``text``: temp file in the same directory, fsync, rename, fsync of
    the directory. A reader sees the old file or the new one, never half of one; a failure
    leaves the old file and no temp file. ``durable=False`` skips both fsyncs (for a write whose
    loss to a crash costs nothing: the old file means the same). Raises OSError."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
