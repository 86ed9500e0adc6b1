"""The one way powerfleet reads a file (or stdin) a person gave it: bounded, UTF-8, one-line errors.

Every file the CLI reads (``--config``, ``--args @FILE``, ``--pods``, ``--input``, ``--old``...)
comes through here, so ``/dev/zero`` or a runaway log given by mistake stops at the limit
instead of reading forever, and a closed or binary stdin is an error, not a traceback or a
string of surrogates. Parsers of what was read raise RecursionError on deeply nested input;
``too_deep`` phrases it.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from typing import Any, BinaryIO

# Far above any real input (a PodList of a few hundred pods is a few MB); far below a hang.
MAX_INPUT_BYTES = 32 * 1024 * 1024
# A FIFO or a pipe (``<(kubectl get pods -o json)``) is read to its end within this long: one whose
# writer never comes (a FIFO nobody writes) fails in one line instead of blocking forever.
INPUT_TIMEOUT_S = 30.0
ENV_INPUT_TIMEOUT = "POWERFLEET_INPUT_TIMEOUT_S"  # seconds, overriding INPUT_TIMEOUT_S (not a config key)


class InputError(ValueError):
    """A file or stdin that cannot be read as text; the message is one line naming it.

    ``reason`` is the same without the name, for a caller that names the file its own way.
    """

    def __init__(self, what: str, reason: str, message: str | None = None) -> None:
        super().__init__(message or f"{what} {reason}")
        self.reason = reason


def _read_capped(stream: BinaryIO, what: str, limit: int) -> bytes:
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputError(what, f"is larger than {limit} bytes (the limit for an input file)")
    return data


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(what, "is not UTF-8 text") from None


def read_text(path: str | os.PathLike[str], limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of ``path``, or of stdin for ``-``; InputError on any problem."""
    if str(path) == "-":
        stdin = sys.stdin
        if stdin is None or getattr(stdin, "buffer", None) is None:
            raise InputError("stdin", "is closed")
        try:
            data = _read_capped(stdin.buffer, "stdin", limit)
        except (OSError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError("stdin", f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
        return _decode(data, "stdin")
    try:
        if is_pipe(path):
            return _decode(_read_pipe(path, limit, input_timeout_s()), str(path))
        with open(path, "rb") as f:
            data = _read_capped(f, str(path), limit)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise InputError(str(path), f"cannot read it ({why})", f"cannot read {path} ({why})") from None
    return _decode(data, str(path))


def input_timeout_s() -> float:
    raw = os.environ.get(ENV_INPUT_TIMEOUT)
    try:
        value = float(raw) if raw else INPUT_TIMEOUT_S
    except ValueError:
        return INPUT_TIMEOUT_S
    return value if 0 < value <= 3600 else INPUT_TIMEOUT_S


def is_pipe(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a FIFO or a pipe (``<(...)``), which only ``read_pipe`` reads safely."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def read_pipe(path: str | os.PathLike[str], limit: int = MAX_INPUT_BYTES) -> bytes:
    """A FIFO's or pipe's bytes (not decoded: a gzip trace may come this way), within the input
    timeout and ``limit``; InputError on any problem."""
    try:
        return _read_pipe(path, limit, input_timeout_s())
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise InputError(str(path), f"cannot read it ({why})", f"cannot read {path} ({why})") from None


def _read_pipe(path: str | os.PathLike[str], limit: int, timeout_s: float) -> bytes:
    """A FIFO's or pipe's bytes to its end, bounded in size and in time.

    Opening a FIFO blocks until a writer opens it, and neither ``open`` nor ``read`` can be
    interrupted from outside, so both run in a daemon thread the caller waits for: past the
    deadline the caller fails (the thread is left blocked, and ends with the process), and a
    Ctrl-C during the wait reaches the caller at once."""
    got: dict[str, Any] = {}

    def read() -> None:
        try:
            with open(path, "rb") as f:
                got["data"] = _read_capped(f, str(path), limit)
        except (OSError, InputError) as exc:
            got["error"] = exc

    reader = threading.Thread(target=read, name="powerfleet-read-pipe", daemon=True)
    reader.start()
    reader.join(timeout_s)
    if reader.is_alive():
        raise InputError(str(path), f"gave no end of input within {timeout_s:g} s (a FIFO with no writer?)")
    if "error" in got:
        raise got["error"]
    return got["data"]


class DuplicateKey(ValueError):
    pass


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A ``json.loads`` object_pairs_hook: json keeps the last of two equal keys without a word."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"key {key!r} appears twice")
        out[key] = value
    return out


def too_deep(what: str) -> str:
    return f"{what} is nested too deeply to parse"
