"""The managed-GPU state record: which GPUs this agent capped, for whom, and at what revision.

``{"version": 2, "managed_uuids": [...], "intent_uuids": [...], "revision": N,
"targets": {"GPU-…": mW}, "owners": {"GPU-…": [{"uid", "namespace", "name"}]}}`` under
``agent.state_dir``, written atomically (temp file, fsync, rename, fsync of the directory).

* ``intent_uuids`` is the write-ahead part: the UUIDs a pass is about to cap, recorded (and
  fsynced) *before* the set, so a SIGKILL between the set and the next save never leaves a cap
  that no record owns. A loaded record counts them as managed.
* ``owners`` is the last pod view of each managed GPU (the pods whose cap is in force):
  orphan recovery and a pass keep a cap while one of them may still exist.
* ``targets`` are the caps in force (what a rebooted node is owed while the node lock cannot
  be taken, issue 32 item 6); ``revision`` is the cap-intent revision ceiling, persisted so
  revisions stay monotonic across restarts whatever the wall clock does.

Loading tells four cases apart: no state directory -> a first start, nothing managed; a
directory without the file, or an unreadable, malformed or mistyped file -> *lost*: the agent
rebuilds the record from the GPUs' current limits (a GPU below its default is taken as
managed, so no cap outlives its owner) and writes it at once (a corrupt file is kept beside
it as ``managed_gpus.json.corrupt`` for a human). Version 1 files (``managed_uuids`` only)
load as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerfleet.agent.files import write_atomic

STATE_FILE = "managed_gpus.json"
MAX_STATE_BYTES = 1024 * 1024
MAX_REVISION = 2**62


@dataclass(frozen=True)
class Owner:
    """A pod that holds a managed GPU's cap, as the last pod view showed it."""

    uid: str
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True)
class Record:
    managed: frozenset[str] = frozenset()
    intent: frozenset[str] = frozenset()
    revision: int = 0
    targets: Mapping[str, int] = field(default_factory=dict)
    owners: Mapping[str, tuple[Owner, ...]] = field(default_factory=dict)

    def dump(self) -> str:
        return json.dumps({
            "version": 2, "managed_uuids": sorted(self.managed), "intent_uuids": sorted(self.intent - self.managed),
            "revision": self.revision, "targets": {u: self.targets[u] for u in sorted(self.targets)},
            "owners": {u: [{"uid": o.uid, "namespace": o.namespace, "name": o.name} for o in self.owners[u]]
                       for u in sorted(self.owners)}}, sort_keys=True)


@dataclass(frozen=True)
class LoadedState:
    uuids: frozenset[str] = field(default_factory=frozenset)  # managed, write-ahead intent included
    conclusive: bool = True
    problem: str = ""
    record: Record = field(default_factory=Record)
    lost: bool = False  # the record is gone or unusable: rebuild from the GPUs' limits

    @property
    def rebuild(self) -> bool:
        return self.lost or not self.conclusive


def _uuid_list(data: Mapping[str, Any], key: str) -> list[str] | None:
    got = data.get(key, [])
    if not isinstance(got, list) or not all(isinstance(u, str) and u for u in got):
        return None
    return got


def _owners(raw: Any) -> dict[str, tuple[Owner, ...]] | None:
    if not isinstance(raw, dict):
        return None
    out: dict[str, tuple[Owner, ...]] = {}
    for uuid, pods in raw.items():
        if not uuid or not isinstance(pods, list):
            return None
        got = []
        for p in pods:
            if not isinstance(p, dict) or not all(isinstance(p.get(k, ""), str) for k in ("uid", "namespace", "name")):
                return None
            if not p.get("uid"):
                return None
            got.append(Owner(p["uid"], p.get("namespace", ""), p.get("name", "")))
        out[uuid] = tuple(got)
    return out


def _targets(raw: Any) -> dict[str, int] | None:
    if not isinstance(raw, dict):
        return None
    if not all(u and type(v) is int and 0 < v < 10**9 for u, v in raw.items()):
        return None
    return dict(raw)


def _bad(problem: str) -> LoadedState:
    return LoadedState(conclusive=False, problem=problem)


def parse_state(text: str) -> LoadedState:
    if not text.strip():
        return LoadedState()
    try:
        data = json.loads(text)
    except ValueError as exc:
        return _bad(f"not JSON ({exc})")
    if not isinstance(data, dict):
        return _bad(f"top level is {type(data).__name__}, not an object")
    managed, intent = _uuid_list(data, "managed_uuids"), _uuid_list(data, "intent_uuids")
    if managed is None:
        return _bad("managed_uuids is not a list of GPU UUID strings")
    if intent is None:
        return _bad("intent_uuids is not a list of GPU UUID strings")
    revision = data.get("revision", 0)
    if type(revision) is not int or not 0 <= revision <= MAX_REVISION:
        return _bad(f"revision is not an integer in 0..{MAX_REVISION}")
    targets, owners = _targets(data.get("targets", {})), _owners(data.get("owners", {}))
    if targets is None:
        return _bad("targets is not an object of GPU UUID -> milliwatts")
    if owners is None:
        return _bad("owners is not an object of GPU UUID -> [{uid, namespace, name}]")
    record = Record(frozenset(managed), frozenset(intent), revision, targets, owners)
    return LoadedState(uuids=frozenset(managed) | frozenset(intent), record=record)


class StateStore:
    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def load(self) -> LoadedState:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            # No directory: this node never had an agent here. A directory without its file: lost.
            lost = self.dir.is_dir()
            return LoadedState(lost=lost, problem=f"{self.path} is missing" if lost else "")
        except OSError as exc:
            return _bad(f"cannot read {self.path}: {exc.strerror or exc}")
        if len(raw) > MAX_STATE_BYTES:
            return _bad(f"{self.path} is larger than {MAX_STATE_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return _bad(f"{self.path} is not UTF-8")
        loaded = parse_state(text)
        if not loaded.conclusive:
            return _bad(f"{self.path}: {loaded.problem}")
        return loaded

    def keep_corrupt(self) -> None:
        """Move an unusable file aside (``.corrupt``) before it is replaced by a rebuilt record."""
        try:
            os.replace(self.path, self.path.with_name(STATE_FILE + ".corrupt"))
        except OSError:
            pass

    def save(self, record: Record | set[str] | frozenset[str], *, durable: bool = True) -> None:
        """Atomically replace the file (``durable``: fsynced). Raises OSError; the caller keeps
        its in-memory record."""
        if not isinstance(record, Record):
            record = Record(managed=frozenset(record))
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, record.dump(), durable=durable)
