"""The sweep fan-in on Redis: sweep records, idempotent shard results, completion, GC.

Why not a Celery chord: a chord's body fires only when *every* header task has returned,
and its counter lives in backend keys (``.j``/``.t``) that, if lost or expired, leave the
body never firing. Retune must decide with what arrived by the deadline, and survive a lost
counter. So completion is derived, never counted:

* ``sweep:<sid>``: the sweep record (JSON): window, term, generation, deadline, shard specs.
* ``result:<key>``: one shard's result (JSON), keyed by ``key = sha256(spec, window)``; the
  spec travels with it and is checked before a result is used (adoption or harvest).
* ``done:<sid>``: a set of finished keys; only a hint (it triggers the harvest early). The
  harvest re-derives completion from the result keys themselves, so losing the set loses
  nothing: the tick harvests every sweep past its deadline.
* ``readers:<sid>``: the keys of shards that are reading the window file right now; the file
  is removed only when this set is empty (a killed shard's entry stays until it is redelivered
  and finishes, or until the sweep is final and the visibility timeout has passed).
* ``sweeps:<dgd>``: the sweeps not yet final, which the tick checks for deadlines.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field

PREFIX = "powerfleet:retune:"
WINDOW_REF = "redis:"  # a shard spec's window_file naming a Redis key instead of a path
TTL_S = 7 * 86400
Status = Literal["running", "decided", "abandoned", "dropped"]


def _k(*parts: str) -> str:
    return PREFIX + ":".join(parts)


class DisaggSpec(BaseModel):
    """A disaggregated deployment's prefill pool and KV link (the spec's ``replicas`` and
    ``profile`` are then the decode pool's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prefill_replicas: int
    prefill_profile: str | None = None  # None: the spec's profile
    kv_transfer_gb_s: float


class ShardSpec(BaseModel):
    """Everything a shard's result depends on; its hash is the shard's key."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dgd: str
    window: int
    window_file: str
    window_sha256: str
    kind: Literal["shard", "probe", "search"]  # search: one round of the edge search (the harvest sends it)
    index: int
    points: list[dict[str, float]]
    objective: str
    sla: dict[str, float] | None = None
    replicas: int
    seed: int = 0
    start_s: float = 0.0  # scoring starts this many seconds after the file's first record (warm-up before)
    warm_policy: dict[str, float] | None = None  # the settings that served the warm-up span
    profile: str | None = None  # the engine profile file (None: the built-in profile)
    disagg: DisaggSpec | None = None  # None: aggregated workers
    dgd_uid: str = ""  # the DGD object whose window this is (a recreated DGD never adopts it)

    def key(self) -> str:
        # A spec hashes as it did before ``disagg`` and ``dgd_uid`` existed when they are unset
        # (results stay adoptable).
        unset = {f for f, v in (("disagg", self.disagg), ("dgd_uid", self.dgd_uid)) if not v}
        dump = self.model_dump_json(exclude=unset or None)
        return hashlib.sha256(dump.encode()).hexdigest()[:32]


class ShardResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    spec: ShardSpec
    candidates: list[dict[str, Any]]  # retune.decision.Candidate dumps
    error: str | None = None
    host: str = ""
    seconds: float = 0.0


class SweepRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sid: str
    dgd: str
    window: int
    term: int
    identity: str
    generation: str
    mode: str
    launched_at: float
    deadline: float
    window_file: str
    requests: int
    replicas: int
    prefill_replicas: int | None = None  # a disaggregated deployment's prefill pool (replicas: its decode pool)
    dgd_uid: str = ""  # the DGD object swept: a harvest under another UID drops the sweep
    dgd_generation: int | None = None  # its metadata.generation at the launch (a spec change abandons)
    current: dict[str, float]
    shards: list[ShardSpec]
    status: Status = "running"
    reason: str = ""
    adopted: int = 0
    search_rounds: int = 0
    extra: dict[str, Any] = Field(default_factory=dict)

    def keys(self) -> list[str]:
        return [s.key() for s in self.shards]


def sweep_id(dgd: str, window: int, generation: str, term: int) -> str:
    return f"{dgd}:{window}:{generation}:{term}"


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class FanIn:
    r: redis.Redis

    # -- sweep records --
    def register(self, rec: SweepRecord) -> bool:
        """Store a new sweep; False if that sweep id exists already (a redelivered launch)."""
        ok = self.r.set(_k("sweep", rec.sid), rec.model_dump_json(), nx=True, ex=TTL_S)
        if ok:
            self.r.sadd(_k("sweeps", rec.dgd), rec.sid)
            self.r.sadd(_k("all", rec.dgd), rec.sid)
        return bool(ok)

    def sweep(self, sid: str) -> SweepRecord | None:
        raw = self.r.get(_k("sweep", sid))
        return SweepRecord.model_validate_json(raw) if raw else None

    def save(self, rec: SweepRecord) -> None:
        self.r.set(_k("sweep", rec.sid), rec.model_dump_json(), ex=TTL_S)
        if rec.status != "running":
            self.r.srem(_k("sweeps", rec.dgd), rec.sid)

    def active(self, dgd: str) -> list[SweepRecord]:
        out = []
        for sid in sorted(self.r.smembers(_k("sweeps", dgd))):
            rec = self.sweep(sid.decode() if isinstance(sid, bytes) else sid)
            if rec is not None and rec.status == "running":
                out.append(rec)
        return out

    def finish(self, rec: SweepRecord, status: Status, reason: str) -> SweepRecord:
        """Make a sweep final; its window file goes as soon as no shard reads it."""
        done = rec.model_copy(update={"status": status, "reason": reason})
        self.save(done)
        self.gc_window_file(done)
        return done

    # -- shard results --
    def result(self, key: str) -> ShardResult | None:
        raw = self.r.get(_k("result", key))
        if not raw:
            return None
        try:
            return ShardResult.model_validate_json(raw)
        except ValueError:
            return None  # an unreadable result is recomputed, never used

    def adoptable(self, spec: ShardSpec) -> ShardResult | None:
        """An existing result for this exact spec (checked, not trusted by key alone)."""
        res = self.result(spec.key())
        return res if res is not None and res.spec == spec and res.error is None else None

    def store(self, res: ShardResult) -> None:
        # Shards are deterministic: a duplicate run writes the same result, so last write is fine.
        self.r.set(_k("result", res.key), res.model_dump_json(), ex=TTL_S)

    def mark_done(self, sid: str, key: str) -> int:
        """Record a finished shard; returns how many of the sweep's shards are done (a hint)."""
        pipe = self.r.pipeline()
        pipe.sadd(_k("done", sid), key)
        pipe.expire(_k("done", sid), TTL_S)
        pipe.scard(_k("done", sid))
        return int(pipe.execute()[-1])

    def results(self, rec: SweepRecord) -> dict[str, ShardResult]:
        """Results that exist and match their spec, by shard key."""
        out = {}
        for spec in rec.shards:
            res = self.result(spec.key())
            if res is not None and res.spec == spec:
                out[spec.key()] = res
        return out

    def complete(self, rec: SweepRecord) -> bool:
        """Every shard's result exists (a cheap hint; the harvest checks each against its spec)."""
        keys = [_k("result", k) for k in rec.keys()]
        return bool(keys) and int(self.r.exists(*keys)) == len(keys)

    def count_adopted(self, sid: str) -> None:
        self.r.incr(_k("adopted", sid))
        self.r.expire(_k("adopted", sid), TTL_S)

    def adopted(self, sid: str) -> int:
        return int(self.r.get(_k("adopted", sid)) or 0)

    def harvest_claim(self, sid: str, hold_s: int) -> bool:
        """One harvest at a time per sweep; the claim expires so a crashed harvest is retried."""
        return bool(self.r.set(_k("harvesting", sid), "1", nx=True, ex=max(1, hold_s)))

    def harvest_release(self, sid: str) -> None:
        self.r.delete(_k("harvesting", sid))

    # -- window file readers (reference counting for GC) --
    def reading(self, sid: str, key: str, who: str) -> None:
        """A shard starts reading the window file (``who``: host:pid, for operators and tests)."""
        self.r.hset(_k("readers", sid), key, who)
        self.r.expire(_k("readers", sid), TTL_S)

    def read_done(self, sid: str, key: str) -> None:
        self.r.hdel(_k("readers", sid), key)

    def readers(self, sid: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.r.hgetall(_k("readers", sid)).items()}

    def gc_window_file(self, rec: SweepRecord, *, force: bool = False) -> bool:
        """Remove a final sweep's window (file or Redis key) when nothing reads it (or ``force``)."""
        if rec.status == "running" or (self.readers(rec.sid) and not force):
            return False
        self._drop_window(rec.window_file)
        return True

    def _drop_window(self, ref: str) -> None:
        if ref.startswith(WINDOW_REF):
            self.r.delete(ref[len(WINDOW_REF):])
            return
        try:
            os.unlink(ref)
        except FileNotFoundError:
            pass

    # -- windows kept in Redis (a fleet without a shared volume) --
    def put_window(self, sid: str, path: str, ttl_s: int) -> str:
        """Store a cut window in Redis until ``ttl_s``; returns the reference shards read."""
        key = _k("window", sid)
        with open(path, "rb") as fh:
            self.r.set(key, fh.read(), ex=max(1, ttl_s))
        return WINDOW_REF + key

    @contextmanager
    def window_path(self, ref: str, sha256: str) -> Iterator[str]:
        """A local path to read the window from: the file itself, or a private 0600 copy of the
        Redis-held window, checked against the spec's sha256 and removed afterwards."""
        if not ref.startswith(WINDOW_REF):
            yield ref
            return
        data = self.r.get(ref[len(WINDOW_REF):])
        if data is None:
            raise FileNotFoundError(f"window {ref} expired or was removed")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"window {ref} does not match its spec's sha256")
        fd, tmp = tempfile.mkstemp(prefix="powerfleet-window-", suffix=".jsonl.gz")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            yield tmp
        finally:
            os.unlink(tmp)

    def purge(self, dgd: str) -> int:
        """Delete every sweep leftover of a deployment (retune disabled or removed)."""
        n = 0
        for sid in list(self.r.smembers(_k("all", dgd))):
            sid_s = sid.decode() if isinstance(sid, bytes) else sid
            rec = self.sweep(sid_s)
            if rec is not None:
                for key in rec.keys():
                    n += int(self.r.delete(_k("result", key)))
                self._drop_window(rec.window_file)
            self.r.delete(_k("sweep", sid_s), _k("done", sid_s), _k("readers", sid_s), _k("harvesting", sid_s),
                          _k("adopted", sid_s))
        self.r.delete(_k("sweeps", dgd), _k("all", dgd))
        return n
