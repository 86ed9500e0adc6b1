"""Mooncake-format trace I/O.

A trace is JSON lines: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids`` (one id per 512-token block) and an optional ``session_id``. Files may be
plain or gzip, and a gzip file may be several members concatenated (one per frontend
segment). Reading streams line by line:

* a malformed line is counted, reported with its line number and skipped
  (``strict=True`` makes it fatal);
* a corrupt or truncated gzip member is detected by zlib (header, deflate data, CRC and
  length), reported with its byte offset and skipped; reading resumes at the next gzip
  member, so the members after it are not lost. Lines of a member are released only once
  its CRC has checked out, so nothing from a corrupt member leaks into the replay.
"""

from __future__ import annotations

import codecs
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b\x08"
TRACE_BLOCK_TOKENS = 512
_CHUNK = 1 << 20


class TraceError(ValueError):
    """A trace could not be read (strict mode, or the file itself is unusable)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace, as recorded."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: str | None = None
    line: int = 0


@dataclass(frozen=True, slots=True)
class TraceIssue:
    """Something that was skipped while reading: a malformed line or a corrupt gzip member."""

    kind: str  # "line" or "gzip"
    where: int  # line number (1-based) for "line", byte offset for "gzip"
    message: str

    def __str__(self) -> str:
        if self.kind == "line":
            return f"trace line {self.where}: {self.message}"
        return f"trace gzip member at byte {self.where}: {self.message}"


@dataclass
class Trace:
    """The requests of a trace in file order, plus what was skipped."""

    requests: list[TraceRequest]
    issues: list[TraceIssue] = field(default_factory=list)
    lines: int = 0

    @property
    def malformed_lines(self) -> int:
        return sum(1 for i in self.issues if i.kind == "line")

    @property
    def corrupt_members(self) -> int:
        return sum(1 for i in self.issues if i.kind == "gzip")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_line(text: bytes | str, line_no: int) -> TraceRequest:
    """Parse one JSON line; raise ``ValueError`` with what was wrong (no line prefix)."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise ValueError("timestamp must be a non-negative number of milliseconds")
    isl = obj.get("input_length")
    if not _is_int(isl) or isl < 0:
        raise ValueError("input_length must be a non-negative integer")
    osl = obj.get("output_length")
    if not _is_int(osl) or osl < 0:
        raise ValueError("output_length must be a non-negative integer")
    hashes = obj.get("hash_ids")
    if not isinstance(hashes, list) or not all(_is_int(h) for h in hashes):
        raise ValueError("hash_ids must be a list of integers")
    sid = obj.get("session_id")
    if sid is not None:
        if isinstance(sid, bool) or not isinstance(sid, (str, int)):
            raise ValueError("session_id must be a string or an integer")
        sid = str(sid)
    return TraceRequest(float(ts), isl, osl, tuple(hashes), sid, line_no)


def _split_lines(buf: bytes) -> tuple[list[bytes], bytes]:
    parts = buf.split(b"\n")
    return parts[:-1], parts[-1]


def _gzip_members(data: bytes, issues: list[TraceIssue], strict: bool) -> Iterator[bytes]:
    """Yield the decompressed bytes of each good gzip member, in order."""
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos : pos + 3] != GZIP_MAGIC:
            if not data[pos:].strip(b"\x00"):
                return  # trailing zero padding
            bad_at = pos
            nxt = data.find(GZIP_MAGIC, pos + 1)
            msg = "bytes between gzip members are not a gzip header"
            if strict:
                raise TraceError(str(TraceIssue("gzip", bad_at, msg)))
            issues.append(TraceIssue("gzip", bad_at, msg))
            if nxt < 0:
                return
            pos = nxt
            continue
        start = pos
        out: list[bytes] = []
        d = zlib.decompressobj(wbits=31)
        err: str | None = None
        cur = pos
        try:
            while not d.eof and cur < n:
                chunk = data[cur : cur + _CHUNK]
                cur += len(chunk)
                out.append(d.decompress(chunk))
            if not d.eof:
                err = "truncated (no end of member)"
        except zlib.error as exc:
            err = f"corrupt ({exc})"
        if err is None:
            yield b"".join(out)
            pos = cur - len(d.unused_data)
            continue
        if strict:
            raise TraceError(str(TraceIssue("gzip", start, err)))
        issues.append(TraceIssue("gzip", start, err + "; skipped"))
        # Resynchronise on the next gzip header that decompresses; the region in between
        # (one corrupt member) is lost, the members after it are kept.
        nxt = data.find(GZIP_MAGIC, start + 1)
        while nxt >= 0 and not _member_starts_cleanly(data, nxt):
            nxt = data.find(GZIP_MAGIC, nxt + 1)
        if nxt < 0:
            return
        pos = nxt


def _member_starts_cleanly(data: bytes, pos: int) -> bool:
    """A cheap check that a gzip header at ``pos`` is real: its member decompresses to the end."""
    d = zlib.decompressobj(wbits=31)
    try:
        cur = pos
        while not d.eof and cur < len(data):
            d.decompress(data[cur : cur + _CHUNK], 0)
            cur += _CHUNK
    except zlib.error:
        return False
    return d.eof


def _check_text(p: Path, head: bytes) -> None:
    """A plain trace must be UTF-8 text: refuse binary data at once, in one line."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        raise TraceError(f"trace {str(p)!r} is neither UTF-8 JSON lines nor gzip (binary data)") from None
    if b"\x00" in head:
        raise TraceError(f"trace {str(p)!r} is neither UTF-8 JSON lines nor gzip (NUL bytes)")


def iter_trace_lines(path: str | Path, issues: list[TraceIssue], strict: bool = False) -> Iterator[bytes]:
    """Yield raw lines (without newline) of a plain or gzip trace file."""
    p = Path(path)
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise TraceError(f"cannot open trace {str(p)!r}: {exc.strerror or exc}") from None
    with fh:
        head = fh.read(3)
        fh.seek(0)
        if head != GZIP_MAGIC:
            _check_text(p, fh.read(4096))
            fh.seek(0)
            for raw in fh:
                yield raw.rstrip(b"\r\n")
            return
        data = fh.read()
    for member in _gzip_members(data, issues, strict):
        lines, rest = _split_lines(member)
        yield from (ln.rstrip(b"\r") for ln in lines)
        if rest.strip():
            yield rest.rstrip(b"\r")


def iter_trace(path: str | Path, issues: list[TraceIssue], strict: bool = False) -> Iterator[TraceRequest]:
    """Stream the requests of a trace; malformed lines go to ``issues`` (or raise if strict)."""
    line_no = 0
    for raw in iter_trace_lines(path, issues, strict):
        line_no += 1
        if not raw.strip():
            continue
        try:
            yield parse_line(raw, line_no)
        except ValueError as exc:
            issue = TraceIssue("line", line_no, str(exc))
            if strict:
                raise TraceError(str(issue)) from None
            issues.append(issue)


def read_trace(path: str | Path, strict: bool = False) -> Trace:
    """Read a whole trace into memory (requests in file order)."""
    issues: list[TraceIssue] = []
    reqs: list[TraceRequest] = []
    count = 0
    for req in iter_trace(path, issues, strict):
        reqs.append(req)
        count = req.line
    last_line = max(count, max((i.where for i in issues if i.kind == "line"), default=0))
    return Trace(reqs, issues, last_line)


def select_window(
    requests: list[TraceRequest], start_s: float | None, end_s: float | None
) -> list[TraceRequest]:
    """Requests whose timestamp falls in [start_s, end_s) seconds from the trace's first timestamp."""
    if not requests:
        return []
    t0 = min(r.timestamp_ms for r in requests)
    lo = -math.inf if start_s is None else t0 + start_s * 1000.0
    hi = math.inf if end_s is None else t0 + end_s * 1000.0
    return [r for r in requests if lo <= r.timestamp_ms < hi]


def dumps_request(req: TraceRequest) -> str:
    """One Mooncake JSON line (used by tests and fixtures)."""
    obj: dict[str, object] = {
        "timestamp": int(req.timestamp_ms) if req.timestamp_ms.is_integer() else req.timestamp_ms,
        "input_length": req.input_length,
        "output_length": req.output_length,
        "hash_ids": list(req.hash_ids),
    }
    if req.session_id is not None:
        obj["session_id"] = req.session_id
    return json.dumps(obj)
