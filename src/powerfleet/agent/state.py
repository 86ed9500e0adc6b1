"""The managed-GPU state file: UUIDs of the GPUs this agent has capped.

``{"version": 1, "managed_uuids": ["GPU-...", ...]}`` under ``agent.state_dir``, written
atomically (temp file, fsync, rename, fsync of the directory). Loading tells three cases
apart: missing or empty -> conclusively nothing managed; unreadable, malformed or wrong
types -> *inconclusive*: the agent starts without orphan recovery and does not overwrite
the file until a pass has succeeded (so a transient read error never erases the record).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from powerfleet.agent.files import write_atomic

STATE_FILE = "managed_gpus.json"
MAX_STATE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LoadedState:
    uuids: frozenset[str] = field(default_factory=frozenset)
    conclusive: bool = True
    problem: str = ""


def parse_state(text: str) -> LoadedState:
    if not text.strip():
        return LoadedState()
    try:
        data = json.loads(text)
    except ValueError as exc:
        return LoadedState(conclusive=False, problem=f"not JSON ({exc})")
    if not isinstance(data, dict):
        return LoadedState(conclusive=False, problem=f"top level is {type(data).__name__}, not an object")
    uuids = data.get("managed_uuids", [])
    if not isinstance(uuids, list) or not all(isinstance(u, str) and u for u in uuids):
        return LoadedState(conclusive=False, problem="managed_uuids is not a list of GPU UUID strings")
    return LoadedState(uuids=frozenset(uuids))


class StateStore:
    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def load(self) -> LoadedState:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return LoadedState()
        except OSError as exc:
            return LoadedState(conclusive=False, problem=f"cannot read {self.path}: {exc.strerror or exc}")
        if len(raw) > MAX_STATE_BYTES:
            return LoadedState(conclusive=False, problem=f"{self.path} is larger than {MAX_STATE_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return LoadedState(conclusive=False, problem=f"{self.path} is not UTF-8")
        loaded = parse_state(text)
        if not loaded.conclusive:
            return LoadedState(conclusive=False, problem=f"{self.path}: {loaded.problem}")
        return loaded

    def save(self, uuids: set[str] | frozenset[str]) -> None:
        """Atomically replace the file. Raises OSError; the caller keeps its in-memory set."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps({"version": 1, "managed_uuids": sorted(uuids)}, sort_keys=True))
