"""The what-if's faults (``power whatif --fault KIND:GPUS:START:END``; docs/power.md, "What-if").

Each fault acts on some of the group's GPUs (by index: ``3``, ``0-3``, ``0,4-7``) over simulated
seconds [START, END), as the live fleet would see it:

* ``unreadable``: their reports carry no draw; ``zero``: they read 0 W; ``stuck``: they read what
  they read when the fault began. The GPUs draw as before; only the readings lie, and the guard
  judges them with its sensor check (power/sensors.py), as live.
* ``agent-dead``: their agent is gone: NVML keeps the limits in force at START, no new cap reaches
  them, and no report comes (the last one lingers, stale after ``stale_periods``). At END a new
  agent starts and follows the guard from its next tick.
* ``agent-restart``: their agent restarts at START and no overlay reaches it until END (the guard
  or Redis out of its reach): it applies its safe caps from its own state at once and reports
  nothing until END.

``check_gpus`` and ``check_span`` refuse, in one line, a fault on GPUs the group lacks and a fault or
a telemetry loss that starts when the replay is over.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Kind = Literal["unreadable", "zero", "stuck", "agent-dead", "agent-restart"]
KINDS: tuple[str, ...] = ("unreadable", "zero", "stuck", "agent-dead", "agent-restart")
SENSOR_KINDS = ("unreadable", "zero", "stuck")
AGENT_KINDS = ("agent-dead", "agent-restart")
_RANGE = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")


class FaultSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Kind
    gpus: tuple[int, ...] = Field(min_length=1)
    start_s: float = Field(ge=0)
    end_s: float

    def active(self, t: float) -> bool:
        return self.start_s <= t < self.end_s

    def text(self) -> str:
        runs: list[list[int]] = []
        for i in self.gpus:
            if runs and i == runs[-1][1] + 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        gpus = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
        return f"{self.kind}:{gpus}:{self.start_s:g}:{self.end_s:g}"


def _gpus(text: str, whole: str) -> tuple[int, ...]:
    out: set[int] = set()
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ValueError(f"--fault {whole!r}: GPUS must be indexes or ranges like 0-3,6, got {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi - lo > 65535:
            raise ValueError(f"--fault {whole!r}: the range {part.strip()!r} runs backwards or is too long")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def parse_fault(text: str) -> FaultSpec:
    """``KIND:GPUS:START:END``; ``ValueError`` in one line naming the option."""
    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"--fault must be KIND:GPUS:START:END (KIND one of {', '.join(KINDS)}), got {text!r}")
    kind, gpus, a, b = (p.strip() for p in parts)
    if kind not in KINDS:
        raise ValueError(f"--fault {text!r}: unknown kind {kind!r}; one of {', '.join(KINDS)}")
    try:
        lo, hi = float(a), float(b)
    except ValueError:
        raise ValueError(f"--fault {text!r}: START and END must be seconds") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise ValueError(f"--fault {text!r}: must satisfy 0 <= START < END (finite seconds)")
    return FaultSpec(kind=kind, gpus=_gpus(gpus, text), start_s=lo, end_s=hi)  # type: ignore[arg-type]


def check_gpus(faults: Sequence[FaultSpec], gpus: int) -> None:
    """Refuse a fault on GPUs the group does not have (one line)."""
    for f in faults:
        if f.gpus[-1] >= gpus:
            raise ValueError(f"--fault {f.text()}: the group has GPUs 0-{gpus - 1}, not {f.gpus[-1]}")


def check_span(faults: Sequence[FaultSpec], loss: tuple[float, float] | None, run_s: float) -> None:
    """Refuse a fault or a telemetry loss that starts when the replay is over (``run_s``: the
    simulated seconds it ran, until its last request completed): none of it would happen, and a
    run that silently ignored it would read as one that survived it. One that starts within the
    replay and outlasts it simply lasts to its end."""
    end = f"the replay ended at {run_s:g} s"
    if loss is not None and loss[0] >= run_s:
        raise ValueError(f"--telemetry-loss {loss[0]:g}:{loss[1]:g} starts after {end}")
    for f in faults:
        if f.start_s >= run_s:
            raise ValueError(f"--fault {f.text()} starts after {end}")
