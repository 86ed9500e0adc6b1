"""The window cut: merge the frontends' gzip trace segments of one window into one file.

Frontends write Mooncake JSON lines (``timestamp`` in epoch ms) as gzip segments under
``<trace_dir>/segments/<dgd>/<pod>/``. The cut streams every segment, keeps the records whose
timestamp falls in [start, end), and writes them to ``<trace_dir>/windows/<dgd>/w<k>.jsonl.gz``
(mode 0600, published by an atomic rename).

Memory does not grow with the window: input is read in fixed chunks, and each input gzip
member's kept lines are compressed straight into one output member. A member that turns out
corrupt (bad header, deflate error, CRC or length mismatch, truncation) is rolled back by
truncating the output to where that member began; it is skipped and counted, and reading
resumes at the next gzip header. Nothing from a corrupt member reaches the window file.

Deployment and pod names must be DNS names, and every path is resolved and checked to stay
inside the trace directory, so no name (``..``, ``/``, a symlink) can make a path escape it.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from powerfleet.sim.trace import GZIP_MAGIC, parse_line

_CHUNK = 1 << 16
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class CutError(ValueError):
    """The cut could not run (bad name, unreadable directory); one line."""


@dataclass
class CutResult:
    path: str | None  # None: the window had no traffic, no file was written
    requests: int = 0  # records inside the window (scored)
    warmup_requests: int = 0  # records of the warm-up span before it (replayed, not scored)
    first_ms: float | None = None  # the earliest timestamp written (where the file's clock starts)
    segments: int = 0
    corrupt_members: int = 0
    malformed_lines: int = 0
    segments_skipped: int = 0  # last written before the warm-up span began: nothing to read
    segments_pruned: int = 0  # older than the retention: deleted
    bytes_read: int = 0
    issues: list[str] = field(default_factory=list)


def safe_name(name: str, what: str) -> str:
    if not _DNS.match(name) or ".." in name:
        raise CutError(f"{what} {name!r} is not a DNS name; refusing to build a path from it")
    return name


def _inside(root: Path, p: Path) -> bool:
    try:
        return p.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def segments_dir(trace_dir: str | Path, dgd: str) -> Path:
    root = Path(trace_dir)
    d = root / "segments" / safe_name(dgd, "deployment")
    if d.exists() and not _inside(root, d):
        raise CutError(f"segments of {dgd!r} resolve outside the trace directory")
    return d


def window_path(trace_dir: str | Path, dgd: str, k: int) -> Path:
    return Path(trace_dir) / "windows" / safe_name(dgd, "deployment") / f"w{int(k)}.jsonl.gz"


class _Out:
    """Gzip output, one member per accepted input member, with rollback to a mark."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.comp: zlib._Compress | None = None
        self.mark = 0
        self.pending = 0  # lines written in the open member
        self.scored = 0  # of which inside the window
        self.first: float | None = None  # earliest timestamp in the open member

    def begin(self) -> None:
        self.mark = self.fh.tell()
        self.comp = zlib.compressobj(6, zlib.DEFLATED, 31)
        self.pending, self.scored, self.first = 0, 0, None

    def line(self, raw: bytes, ts_ms: float, scored: bool) -> None:
        assert self.comp is not None
        self.fh.write(self.comp.compress(raw + b"\n"))
        self.pending += 1
        self.scored += scored
        self.first = ts_ms if self.first is None else min(self.first, ts_ms)

    def commit(self, res: CutResult) -> None:
        """Close the open member and count what it holds into ``res``."""
        assert self.comp is not None
        if self.pending:
            self.fh.write(self.comp.flush())
            res.requests += self.scored
            res.warmup_requests += self.pending - self.scored
            if self.first is not None:
                res.first_ms = self.first if res.first_ms is None else min(res.first_ms, self.first)
        else:
            self.rollback()  # an empty member is noise; drop it
        self.comp = None

    def rollback(self) -> None:
        self.fh.seek(self.mark)
        self.fh.truncate()
        self.comp, self.pending, self.scored, self.first = None, 0, 0, None


class _Filter:
    def __init__(self, lo_ms: float, hi_ms: float, res: CutResult, out: _Out, warm_ms: float = 0.0,
                 floor_ms: float | None = None) -> None:
        self.lo, self.hi, self.res, self.out = lo_ms, hi_ms, res, out
        self.warm_lo = lo_ms - warm_ms  # the warm-up span before the window is kept, not scored
        if floor_ms is not None:  # nothing from before the object's own lifetime, warm-up or scored
            self.warm_lo = max(self.warm_lo, floor_ms)
        self.rest = b""

    def feed(self, data: bytes) -> None:
        buf = self.rest + data
        lines = buf.split(b"\n")
        self.rest = lines.pop()
        for ln in lines:
            self._one(ln)

    def end(self) -> None:
        if self.rest.strip():
            self._one(self.rest)
        self.rest = b""

    def _one(self, raw: bytes) -> None:
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            return
        try:
            req = parse_line(raw, 0)
        except ValueError:
            self.res.malformed_lines += 1
            return
        if self.warm_lo <= req.timestamp_ms < self.hi:
            self.out.line(raw, req.timestamp_ms, req.timestamp_ms >= self.lo)


def _next_magic(fh: BinaryIO, start: int) -> int | None:
    pos = start
    fh.seek(pos)
    tail = b""
    while True:
        chunk = fh.read(_CHUNK)
        if not chunk:
            return None
        buf = tail + chunk
        i = buf.find(GZIP_MAGIC)
        if i >= 0:
            return pos - len(tail) + i
        tail = buf[-2:]
        pos += len(chunk)


def _cut_gzip(fh: BinaryIO, size: int, flt: _Filter, out: _Out, res: CutResult, name: str) -> None:
    pos = 0
    while pos < size:
        fh.seek(pos)
        if fh.read(3) != GZIP_MAGIC:
            nxt = _next_magic(fh, pos + 1)
            res.corrupt_members += 1
            res.issues.append(f"{name}: bytes at {pos} are not a gzip member; skipped")
            if nxt is None:
                return
            pos = nxt
            continue
        fh.seek(pos)
        d = zlib.decompressobj(wbits=31)
        out.begin()
        cur, ok, err = pos, False, "truncated (no end of member)"
        try:
            while True:
                chunk = fh.read(_CHUNK)
                if not chunk:
                    break
                cur += len(chunk)
                res.bytes_read += len(chunk)
                flt.feed(d.decompress(chunk))
                if d.eof:
                    ok = True
                    cur -= len(d.unused_data)
                    break
        except zlib.error as exc:
            err = f"corrupt ({exc})"
        if ok:
            flt.end()
            out.commit(res)
            pos = cur
            continue
        flt.rest = b""
        out.rollback()
        res.corrupt_members += 1
        res.issues.append(f"{name}: gzip member at byte {pos} {err}; skipped")
        nxt = _next_magic(fh, pos + 1)
        if nxt is None:
            return
        pos = nxt


def _cut_plain(fh: BinaryIO, flt: _Filter, out: _Out, res: CutResult) -> None:
    out.begin()
    while chunk := fh.read(_CHUNK):
        res.bytes_read += len(chunk)
        flt.feed(chunk)
    flt.end()
    out.commit(res)


def _segment_files(root: Path, seg_dir: Path) -> list[Path]:
    files: list[Path] = []
    if not seg_dir.is_dir():
        return files
    for pod_dir in sorted(seg_dir.iterdir()):
        if pod_dir.is_symlink() or not pod_dir.is_dir() or not _DNS.match(pod_dir.name):
            continue
        for f in sorted(pod_dir.iterdir()):
            if f.is_symlink() or not f.is_file() or not _inside(root, f):
                continue
            if f.name.endswith((".jsonl", ".jsonl.gz", ".gz")):
                files.append(f)
    return files


def cut_window(trace_dir: str | Path, dgd: str, k: int, start_s: float, end_s: float, *,
               warmup_s: float = 0.0, retention_s: float | None = None, now_s: float | None = None,
               not_before_s: float | None = None) -> CutResult:
    """Cut window ``k`` = [start_s, end_s) of ``dgd``, with the ``warmup_s`` seconds before it
    in front (replayed unscored: the warm start); a window with no traffic writes no file.

    Only segments written to since the warm-up span began are read (a record is written
    after its timestamp, so an older file holds nothing of the window); with ``retention_s``
    segments last written more than that before ``now_s`` are deleted. ``not_before_s`` (the
    DGD's creation): records before it belong to an earlier object of the same name and are
    left out, warm-up included."""
    root = Path(trace_dir)
    if not root.is_dir() or not os.access(root, os.R_OK | os.X_OK):
        raise CutError(f"trace directory {str(root)!r} is not a readable directory")
    seg_dir = segments_dir(root, dgd)
    dest = window_path(root, dgd, k)
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = dest.with_name(dest.name + f".{os.getpid()}.tmp")
    res = CutResult(path=None)
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
    try:
        with os.fdopen(fd, "w+b") as fh_out:
            out = _Out(fh_out)
            flt = _Filter(start_s * 1000.0, end_s * 1000.0, res, out, warmup_s * 1000.0,
                          None if not_before_s is None else not_before_s * 1000.0)
            for f in _segment_files(root, seg_dir):
                mtime = f.stat().st_mtime
                if retention_s is not None and now_s is not None and mtime < now_s - retention_s:
                    f.unlink(missing_ok=True)
                    res.segments_pruned += 1
                    continue
                if mtime < start_s - warmup_s:
                    res.segments_skipped += 1
                    continue
                res.segments += 1
                with f.open("rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if fh.read(3) == GZIP_MAGIC:
                        _cut_gzip(fh, size, flt, out, res, f"{f.parent.name}/{f.name}")
                    else:
                        fh.seek(0)
                        _cut_plain(fh, flt, out, res)
        if res.requests == 0:
            tmp.unlink()
            return res
        os.chmod(tmp, 0o600)
        os.replace(tmp, dest)
        res.path = str(dest)
        return res
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
