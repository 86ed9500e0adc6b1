"""A scenario's files, read bounded: the one reader of a scenario file and of the manifests it names.

Apart from ``scenario_load`` so that ``scenario_manifests`` (which ``scenario_model`` calls while
it validates) reads files the same way without importing the loader back.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 32



class ScenarioError(ValueError):
    """A scenario that cannot be run; the message is one line."""


def read_bounded(path: Path, what: str) -> str:
    """The UTF-8 text of a regular file of at most MAX_BYTES; a FIFO or device is never opened."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ScenarioError(f"{what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ScenarioError(f"{what} {path}: not a regular file")
    if st.st_size > MAX_BYTES:
        raise ScenarioError(f"{what} {path}: {st.st_size} bytes, over the {MAX_BYTES} byte limit")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise ScenarioError(f"{what} {path}: over the {MAX_BYTES} byte limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{what} {path}: not UTF-8 text") from None


def _depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    stack = [(obj, 1)]
    deepest = 0
    while stack:
        o, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return deepest
