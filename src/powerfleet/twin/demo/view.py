"""The demo's live view: rich panels on a terminal, plain log lines otherwise.

Both render the same ``ViewState``: fleet and per-rack power against budget, caps per node,
queue depths, the last decisions, the scenario's steps and the Flower URL.

One clock: every line and decision carries the wall-clock time (``clock``), the same the
report's timeline and plots use. Only what changed is printed: ticks that did nothing are
counted (``quiet_ticks``) on the status line, not printed one by one.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any


@dataclass
class ViewState:
    elapsed_s: float = 0.0
    duration_s: float = 0.0
    flower_url: str = ""
    fleet_w: float = 0.0
    fleet_budget_w: float = 0.0
    rack_w: dict[str, float] = field(default_factory=dict)
    rack_budget_w: dict[str, float] = field(default_factory=dict)
    caps: dict[str, list[float]] = field(default_factory=dict)  # node -> applied cap per GPU
    queues: dict[str, int] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)  # newest last
    steps: dict[str, str] = field(default_factory=dict)  # step -> "pending" | "running" | "ok" | "failed: ..."
    now: float = 0.0  # wall-clock time of this state (epoch seconds)
    quiet_ticks: dict[str, int] = field(default_factory=dict)  # family -> ticks that changed nothing

    def to_json(self) -> dict[str, Any]:
        return {"elapsed_s": round(self.elapsed_s, 1), "fleet_w": self.fleet_w, "fleet_budget_w": self.fleet_budget_w,
                "rack_w": self.rack_w, "rack_budget_w": self.rack_budget_w, "caps": self.caps,
                "queues": self.queues, "decisions": self.decisions[-20:], "steps": self.steps,
                "flower_url": self.flower_url, "quiet_ticks": self.quiet_ticks}


def clock(t: float) -> str:
    """The one clock of the demo's output: local wall-clock time, to the second."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def window_span(k: int, window_s: int) -> str:
    """Retune window k as the clock times it covers (windows are epoch-aligned; the demo's phase is 0)."""
    return f"{clock(k * window_s)}-{clock((k + 1) * window_s)}"


def tick_news(family: str, detail: str, before: str | None, window_s: int) -> str | None:
    """What a tick did when it is news; None for a tick that changed nothing (counted, not printed).

    A reconcile tick fans out to the same nodes every few seconds; a budget tick's fan-out is news
    only when it differs from the last one; a retune tick only when it launched a window's sweep.
    """
    if family == "retune":
        launched = re.findall(r"launched (\S+) window (\d+)", detail)
        if not launched:
            return None
        return "retune: sweep launched for " + ", ".join(f"{d} window {window_span(int(k), window_s)}"
                                                         for d, k in launched)
    if family == "budget" and detail != before and detail.strip():
        return "budget tick: " + " ".join(detail.split())
    return None


def _caps_text(caps: list[float]) -> str:
    return " ".join(f"{c:.0f}" for c in caps)


class PlainView:
    """One status line every ``every_s`` seconds, and each new decision as it happens."""

    def __init__(self, out: IO[str] | None = None, every_s: float = 5.0) -> None:
        self.out = out or sys.stderr
        self.every_s = every_s
        self._last_line = -1e9
        self._seen = 0

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, s: ViewState) -> None:
        for line in s.decisions[self._seen:]:  # each already carries its clock time
            self.out.write(f"  {line}\n")
        self._seen = len(s.decisions)
        if s.elapsed_s - self._last_line >= self.every_s:
            self._last_line = s.elapsed_s
            racks = " ".join(f"{r} {w:.0f}/{s.rack_budget_w.get(r, 0):.0f} W" for r, w in sorted(s.rack_w.items()))
            queues = " ".join(f"{q}={n}" for q, n in sorted(s.queues.items()) if n or q in ("control", "sweep"))
            quiet = ", ".join(f"{f} {n}" for f, n in sorted(s.quiet_ticks.items()) if n)
            quiet = f" | ticks without change: {quiet}" if quiet else ""
            self.out.write(f"  {clock(s.now or time.time())}  power fleet {s.fleet_w:.0f}/{s.fleet_budget_w:.0f} W | "
                           f"{racks} | queues (messages) {queues}{quiet}\n")
        self.out.flush()


class RichView:
    """A ``rich.live.Live`` dashboard, refreshed on every update."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> RichView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, s: ViewState) -> None:
        self.live.update(render(s))


def render(s: ViewState) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    power = Table.grid(padding=(0, 1))
    power.add_column(width=10)
    power.add_column(width=30)
    power.add_column()
    rows = [("fleet", s.fleet_w, s.fleet_budget_w)] + [(r, w, s.rack_budget_w.get(r, 0.0)) for r, w in sorted(s.rack_w.items())]
    for name, w, budget in rows:
        bar = ProgressBar(total=max(budget, 1.0), completed=min(w, budget), width=30,
                          complete_style="red" if w > budget else "green")
        power.add_row(name, bar, f"{w:,.0f} / {budget:,.0f} W")
    caps = Table("node", "applied cap per GPU (W)", box=None, padding=(0, 1))
    for node, values in sorted(s.caps.items()):
        caps.add_row(node, _caps_text(values))
    queues = Table("queue", "depth (messages)", box=None, padding=(0, 1))
    for q, n in sorted(s.queues.items()):
        queues.add_row(q, str(n))
    steps = Table("step", "state", box=None, padding=(0, 1))
    for name, state in s.steps.items():
        style = "green" if state == "ok" else "red" if state.startswith("failed") else "yellow"
        steps.add_row(name, f"[{style}]{state}[/]")
    decisions = "\n".join(s.decisions[-8:]) or "(none yet)"
    head = (f"powerfleet demo  {clock(s.now or time.time())}  {s.elapsed_s:.0f} s of {s.duration_s:.0f} s   "
            f"Flower {s.flower_url}")
    return Group(
        Panel(power, title=head, title_align="left"),
        Panel(caps, title="caps"), Panel(queues, title="queues"), Panel(steps, title="scenario"),
        Panel(decisions, title="last decisions"),
    )


def make_view(force_plain: bool = False, is_tty: Callable[[], bool] | None = None) -> PlainView | RichView:
    tty = (is_tty or sys.stderr.isatty)()
    return PlainView() if force_plain or not tty else RichView()


# retune's decision reason (retune/decision.py): "best B vs probe P <units> (<direction>), <+x.xxx> % <why>".
_DECISION = re.compile(r"best (?P<best>\S+) vs probe (?P<probe>\S+) (?P<units>.+?) \((?P<dir>minimize|maximize)\)"
                       r"(?:, (?P<pct>[+-]\d+(?:\.\d+)?) %)?"
                       r" (?P<why>ties the probe; keeping the current settings|is worse than the probe|"
                       r"does not beat the probe by more than (?P<min>\S+) %|beats the probe by more than (?P<min2>\S+) %)")


def decision_text(reason: str) -> str:
    """A retune reason in the report's words: the probe is the current settings, and a candidate
    that did not beat them is never called "best" ("no candidate beat the current settings by
    more than 1 %"); a change of under 0.001 % is "the same", never "-0.000 %"."""
    def say(m: re.Match[str]) -> str:
        pct = float(m.group("pct")) if m.group("pct") else None
        how = ("the same" if pct is None or abs(pct) < 0.0005 else
               f"{abs(pct):.3f} % {'better' if pct > 0 else 'worse'}")
        figures = f"top candidate {m.group('best')} vs current {m.group('probe')} {m.group('units')}, {how}"
        if m.group("min2"):
            return f"a candidate beat the current settings by more than {m.group('min2')} % ({figures})"
        least = f" by more than {m.group('min')} %" if m.group("min") else ""
        return f"no candidate beat the current settings{least} ({figures})"
    return _DECISION.sub(say, reason)
