"""Budget state kept in Redis (JSON only): proposals (last writer wins), admitted power inputs,
the rolling-stretch flags, and the last figures per deployment/group that gauges read."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import redis
from pydantic import ValidationError

from powerfleet.broker.epoch import broker_epoch, epoch_of
from powerfleet.budget.load import MAX_REPLICAS
from powerfleet.cluster.immutability import AdmittedPowerInputs

PROPOSALS = "powerfleet:budget:proposals"
ADMITTED = "powerfleet:budget:admitted"
ROLLING = "powerfleet:budget:rolling"
FIGURES = "powerfleet:budget:figures"
REPLICAS = "powerfleet:budget:replicas"  # the replica counts an evaluation left (read or written)
OTHER_WRITER = "powerfleet:budget:other-writer"  # deployments another writer was seen scaling (why)
GROUP_HISTORY = "powerfleet:budget:group-history"  # one JSON entry per tick: each group's figures
GROUP_HISTORY_LEN = 2880  # a day of 30 s ticks; the oldest entries are dropped
log = logging.getLogger("powerfleet.budget")
T = TypeVar("T")


def _replicas_record(raw: bytes) -> tuple[dict[str, int], str | None] | None:
    """(counts, epoch) of a replica-count record; a record from before epochs is a bare {c: n}.
    None for a record that is neither (corrupt, or written by something else): the evaluation
    then re-derives the counts from the cluster, as after a failover."""
    try:
        rec = json.loads(raw)
        if isinstance(rec, dict) and isinstance(rec.get("counts"), dict) and "epoch" in rec:
            counts, epoch = rec["counts"], rec["epoch"]
        else:
            counts, epoch = rec, None
        if not isinstance(counts, dict) or not (epoch is None or isinstance(epoch, str)) or not all(
                type(v) is int and 0 <= v <= 1_000_000 for v in counts.values()):
            return None
        return {str(k): v for k, v in counts.items()}, epoch
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _proposal_record(raw: bytes) -> dict[str, int] | None:
    """The {role: count} of a stored proposal ({"replicas": ..., "at": ..., "source": ...}); None for
    a record that is not one (corrupt, or written by something else): no proposal, as if none was made."""
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    replicas = rec.get("replicas") if isinstance(rec, dict) else None
    if not isinstance(replicas, dict) or not all(type(v) is int and 0 <= v <= MAX_REPLICAS for v in replicas.values()):
        return None
    return {str(k): v for k, v in replicas.items()}


def _admitted_record(raw: bytes) -> AdmittedPowerInputs | None:
    """A stored admission; None for one that is not (corrupt, foreign, or of an older shape): the
    deployment is then admitted afresh from a settled snapshot, as after ``budget.readmit``."""
    try:
        return AdmittedPowerInputs.model_validate_json(raw)
    except (ValidationError, ValueError, UnicodeDecodeError, RecursionError):
        return None


_THEN = {"proposal": "no proposal until a new one is sent",
         "admission": "admitted afresh from a settled snapshot"}


def _skipped(what: str, keys: list[str]) -> None:
    if keys:
        log.warning("unreadable %s record%s ignored (%s): %s", what, "s" if len(keys) > 1 else "", _THEN[what],
                    ", ".join(sorted(keys)))


class BudgetState:
    def __init__(self, client: redis.Redis) -> None:
        self._r = client
        self._epoch: str | None = None  # the broker epoch last_replicas read (broker/epoch.py)

    # proposals: {role: count}; a later proposal replaces the earlier one whole
    def propose(self, deployment: str, replicas: Mapping[str, int], *, at: float, source: str) -> dict[str, Any]:
        record = {"replicas": dict(replicas), "at": at, "source": source}
        self._r.hset(PROPOSALS, deployment, json.dumps(record, sort_keys=True))
        return record

    # A corrupt or foreign record is skipped with one warning, never raised: one bad field must not
    # stop the tick or an evaluation (as the replica-count records and the group history).
    def proposal(self, deployment: str) -> dict[str, int] | None:
        return self._one(PROPOSALS, "proposal", deployment, _proposal_record)

    def proposals(self) -> dict[str, dict[str, int]]:
        return self._all(PROPOSALS, "proposal", _proposal_record)

    # admitted power inputs
    def admitted(self, deployment: str) -> AdmittedPowerInputs | None:
        return self._one(ADMITTED, "admission", deployment, _admitted_record)

    def all_admitted(self) -> dict[str, AdmittedPowerInputs]:
        return self._all(ADMITTED, "admission", _admitted_record)

    def _one(self, key: str, what: str, deployment: str, parse: Callable[[bytes], T | None]) -> T | None:
        raw = self._r.hget(key, deployment)
        if raw is None:
            return None
        got = parse(raw)
        if got is None:
            _skipped(what, [deployment])
        return got

    def _all(self, key: str, what: str, parse: Callable[[bytes], T | None]) -> dict[str, T]:
        out: dict[str, T] = {}
        bad: list[str] = []
        for k, v in self._r.hgetall(key).items():
            name = k.decode(errors="replace")
            got = parse(v)
            if got is None:
                bad.append(name)
            else:
                out[name] = got
        _skipped(what, bad)
        return out

    def admit(self, deployment: str, record: AdmittedPowerInputs) -> None:
        self._r.hset(ADMITTED, deployment, record.model_dump_json())

    def forget_admission(self, deployment: str) -> bool:
        """Forget the admitted inputs (and a detected other writer): the next evaluation starts afresh."""
        self._r.hdel(OTHER_WRITER, deployment)
        self._r.hdel(REPLICAS, deployment)
        return bool(self._r.hdel(ADMITTED, deployment))

    # who else writes replicas: the counts an evaluation left, and a sticky "other writer" note
    def last_replicas(self, deployment: str) -> dict[str, int] | None:
        """The counts the last evaluation left; None when none, or when they were recorded under
        another broker epoch: a failover may have lost a later record (the promoted replica
        lacked it), and comparing the cluster with an older one would see "another writer" in
        powerfleet's own last scaling. The evaluation then re-derives them from the cluster."""
        with self._r.pipeline(transaction=False) as p:  # one connection: both answers from one master
            p.hget(REPLICAS, deployment)
            p.info("replication")
            raw, info = p.execute(raise_on_error=False)
        if isinstance(raw, Exception):
            raise raw
        self._epoch = epoch_of(info)
        if raw is None:
            return None
        record = _replicas_record(raw)
        if record is None:
            log.warning("%s: unreadable replica-count record ignored; re-derived from the cluster", deployment)
            return None
        counts, epoch = record
        if epoch is not None and self._epoch is not None and epoch != self._epoch:
            log.info("%s: replica counts recorded before a broker failover are not compared; "
                     "re-derived from the cluster", deployment)
            return None
        return counts

    def record_replicas(self, deployment: str, counts: Mapping[str, int]) -> None:
        # Tagged with the epoch read at the start of the evaluation: if a failover came between,
        # the record is ignored once more, never trusted wrongly.
        epoch = self._epoch if self._epoch is not None else broker_epoch(self._r)
        self._r.hset(REPLICAS, deployment, json.dumps({"counts": dict(counts), "epoch": epoch}, sort_keys=True))

    def other_writer(self, deployment: str) -> str | None:
        raw = self._r.hget(OTHER_WRITER, deployment)
        return None if raw is None else raw.decode()

    def flag_other_writer(self, deployment: str, why: str) -> None:
        self._r.hset(OTHER_WRITER, deployment, why)

    # one flag per continuous rolling stretch (the hold warning is logged once per stretch)
    def was_rolling(self, deployment: str) -> bool:
        return bool(self._r.sismember(ROLLING, deployment))

    def set_rolling(self, deployment: str, rolling: bool) -> None:
        (self._r.sadd if rolling else self._r.srem)(ROLLING, deployment)

    # the last figures, for gauges and `status`
    def record_figures(self, key: str, figures: Mapping[str, Any]) -> None:
        self._r.hset(FIGURES, key, json.dumps(dict(figures), sort_keys=True))

    def figures(self) -> dict[str, dict[str, Any]]:
        return {k.decode(): json.loads(v) for k, v in self._r.hgetall(FIGURES).items()}

    def record_groups(self, at: float, groups: Mapping[str, Mapping[str, Any]]) -> None:
        """One tick's figures per group (limit, projected, peak, measured), kept in a bounded list
        for whoever plots them against time (the demo report)."""
        pipe = self._r.pipeline(transaction=False)
        pipe.rpush(GROUP_HISTORY, json.dumps({"at": at, "groups": {g: dict(f) for g, f in groups.items()}},
                                             sort_keys=True))
        pipe.ltrim(GROUP_HISTORY, -GROUP_HISTORY_LEN, -1)
        pipe.execute()

    def group_history(self) -> list[dict[str, Any]]:
        """The recorded ticks, oldest first; an unreadable entry is skipped."""
        out = []
        for raw in self._r.lrange(GROUP_HISTORY, 0, -1):
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("groups"), dict):
                out.append(entry)
        return out
