"""The one clock abstraction. Domain code takes a Clock; only the edges use SystemClock."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...

    def monotonic(self) -> float:
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class FakeClock:
    """A clock that only moves when told to; for tests and the digital twin."""

    t: float = 0.0
    mono: float = field(default=0.0)

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.mono += seconds


class FileClock:
    """Wall time read from a file holding epoch seconds: a clock several processes share.

    The integration tests (and anything that must drive real worker processes through
    chosen instants) write the file; every read sees the latest value. Monotonic time is the
    same reading, so it never runs backwards unless the writer makes it.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def now(self) -> float:
        with open(self.path, encoding="utf-8") as f:
            value = float(f.read().strip())
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"clock file {self.path}: not a finite number")
        return value

    def monotonic(self) -> float:
        return self.now()

    def set(self, t: float) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(repr(float(t)))
        os.replace(tmp, self.path)


class SwitchableClock:
    """The process's clock for code that imported it once: which clock it reads can change."""

    def __init__(self, inner: Clock) -> None:
        self.inner = inner

    def use(self, inner: Clock) -> None:
        self.inner = inner

    def now(self) -> float:
        return self.inner.now()

    def monotonic(self) -> float:
        return self.inner.monotonic()
