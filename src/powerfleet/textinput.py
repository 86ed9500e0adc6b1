"""The one way powerfleet reads a file (or stdin) a person gave it: bounded, UTF-8, one-line errors.

Every file the CLI reads (``--config``, ``--args @FILE``, ``--pods``, ``--input``, ``--old``...)
comes through here, so ``/dev/zero`` or a runaway log given by mistake stops at the limit
instead of reading forever, and a closed or binary stdin is an error, not a traceback or a
string of surrogates. Parsers of what was read raise RecursionError on deeply nested input;
``too_deep`` phrases it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, BinaryIO

# Far above any real input (a PodList of a few hundred pods is a few MB); far below a hang.
MAX_INPUT_BYTES = 32 * 1024 * 1024


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
        with open(path, "rb") as f:
            data = _read_capped(f, str(path), limit)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise InputError(str(path), f"cannot read it ({why})", f"cannot read {path} ({why})") from None
    return _decode(data, str(path))


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
