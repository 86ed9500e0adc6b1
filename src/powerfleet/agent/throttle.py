"""The power guard's overlays inside the agent (issue 22; docs/power.md, "Live").

``OverlayStore`` keeps the last overlay per group with the time it was received on the agent's
own clock, and resolves the cap a GPU gets with ``power.overlay.agent_cap``: while the group's
overlay is fresh, ``min(annotation cap, throttle cap)``; once it is not (guard, beat or Redis
gone), the GPU's safe cap, held until a fresh overlay arrives. The pass calls
``OverlayStore.limit_mw`` where it has resolved a GPU's cap (the hook in ``agent.reconcile``).

``FallbackWatch`` is the thread that makes the fallback bind within one period: it looks at the
store every quarter period and asks for a pass when a group's overlay has just lapsed, so the
agent does not wait for its next tick (15 s) to move the GPUs to their safe caps.

The agent's own fallback needs no one: the store writes each overlay it keeps to the agent's state
directory (``overlays.json``, atomically), and a store built on start reads it back with every
group lapsed, so an agent restarted while the guard, beat or Redis is down enforces its safe caps
from its first pass, and lifts them only on a fresh overlay. ``groups`` (the groups the agent's
configuration says are oversubscribed) bounds what is read back: a group that is not
oversubscribed any more is dropped, its GPUs back at their annotation caps.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from powerfleet.agent.files import write_atomic
from powerfleet.clock import Clock
from powerfleet.power.overlay import GRACE, AgentCap, Overlay, agent_cap

log = logging.getLogger("powerfleet.agent")
OVERLAYS_FILE = "overlays.json"  # in the node's state directory (agent/build.py)


@dataclass(frozen=True)
class Held:
    overlay: Overlay
    # When the guard decided it, on the agent's monotonic clock: its arrival less its age then (the
    # agent's wall clock less the guard's ``issued_at``, never below 0), so a message delivered late
    # is fresh only for what is left of its 1.5 periods (none, past them). None: read back
    # after a restart (lapsed).
    received_at: float | None


class OverlayStore:
    """The last overlay per group (thread-safe: the task thread writes, the pass and the watch read)."""

    def __init__(self, clock: Clock, registry: CollectorRegistry | None = None, *, path: Path | None = None,
                 groups: Iterable[str] | None = None) -> None:
        self.clock = clock
        self.path = path
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}
        self._lapsed: set[str] = set()  # groups whose overlay has lapsed (seen by lapsed_now)
        r = registry if registry is not None else CollectorRegistry()
        self.fallbacks = Counter("powerfleet_agent_power_fallback_activations_total",
                                 "Times a group's overlays stopped and its GPUs went to their safe caps",
                                 ["group"], registry=r)
        self.in_fallback = Gauge("powerfleet_agent_power_fallback", "1 while a group's GPUs are at their safe caps",
                                 ["group"], registry=r)
        self.refused = Counter("powerfleet_agent_power_overlays_refused_total",
                               "Overlays refused: not under the guard's current record in Redis (tasks/agent.py)",
                               ["reason"], registry=r)
        if path is not None:
            self._held = {g: Held(o, None) for g, o in read_overlays(path).items()
                          if groups is None or g in set(groups)}
        self._saved = {g: dict(h.overlay.safe) for g, h in self._held.items()}  # the safe caps on disk

    def receive(self, overlay: Overlay) -> bool:
        """Keep ``overlay`` unless an overlay of a newer revision is already held; True when kept."""
        now = self.clock.monotonic()
        # Its age on arrival, by the agent's wall clock against the guard's: a guard clock ahead
        # counts from the arrival (never fresher than that), one behind makes it older (the safe side).
        age = max(0.0, self.clock.now() - overlay.issued_at)
        with self._lock:
            held = self._held.get(overlay.group)
            if held is not None and overlay.revision < held.overlay.revision:
                return False
            self._held[overlay.group] = Held(overlay, now - age)
            self._save()
            if overlay.group in self._lapsed:
                self._lapsed.discard(overlay.group)
                self.in_fallback.labels(group=overlay.group).set(0)
                log.info("group %s: the guard's overlays are back; caps follow them again", overlay.group)
            return True

    def _save(self) -> None:
        """The overlays held, to the state directory, when their safe caps changed (all a restarted
        agent applies; a write per period would fsync every second). Under the lock; a failed write
        is logged, the overlay kept in memory all the same."""
        safe = {g: dict(h.overlay.safe) for g, h in self._held.items()}
        if self.path is None or safe == self._saved:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps({g: h.overlay.model_dump(mode="json")
                                                for g, h in sorted(self._held.items())}, sort_keys=True))
            self._saved = safe
        except OSError as exc:
            log.error("cannot keep the power guard's overlays in %s (%s); a restart now would enforce the "
                      "annotation caps until the guard is back", self.path, exc)

    def _fresh(self, held: Held, now: float) -> bool:
        return held.received_at is not None and now - held.received_at <= held.overlay.period_s * (1.0 + GRACE)

    def resolve(self, gpu: str, annotation_w: float) -> tuple[AgentCap, str | None]:
        """The cap for ``gpu`` and the group whose overlay names it (None: no overlay names it)."""
        now = self.clock.monotonic()
        with self._lock:
            held = next((h for h in self._held.values() if gpu in h.overlay.safe), None)
        if held is None:
            return AgentCap(annotation_w, "annotation"), None
        return agent_cap(gpu, annotation_w, held.overlay, held.received_at, now), held.overlay.group

    def limit_mw(self, gpu: str, target_mw: int, min_mw: int, max_mw: int) -> tuple[int, AgentCap | None]:
        """The hook of the pass: ``target_mw`` (the annotation's cap, clamped) lowered by the overlay,
        kept within the card's range; the AgentCap is None where no overlay names the GPU."""
        cap, group = self.resolve(gpu, target_mw / 1000)
        if group is None:
            return target_mw, None
        return min(target_mw, max(min_mw, min(max_mw, int(round(cap.cap_w * 1000))))), cap

    def lapsed_now(self) -> list[str]:
        """Groups whose overlay lapsed since the last call (each lapse counted and logged once)."""
        now = self.clock.monotonic()
        out = []
        with self._lock:
            for group, held in sorted(self._held.items()):
                if group not in self._lapsed and not self._fresh(held, now):
                    self._lapsed.add(group)
                    out.append(group)
        for group in out:
            self.fallbacks.labels(group=group).inc()
            self.in_fallback.labels(group=group).set(1)
            got = self._held[group].received_at
            log.warning("group %s: no overlay from the power guard %s (period %gs); its GPUs go to their "
                        "safe caps until the guard is back", group,
                        "since this agent started" if got is None else f"for {now - got:.1f}s",
                        self._held[group].overlay.period_s)
        return out

    def shortest_period_s(self) -> float | None:
        with self._lock:
            return min((h.overlay.period_s for h in self._held.values()), default=None)


class FallbackWatch:
    """Asks for a pass as soon as a group's overlay lapses (checked every quarter period)."""

    def __init__(self, store: OverlayStore, request_pass: Callable[[str], None], idle_s: float = 1.0) -> None:
        self.store = store
        self.request_pass = request_pass
        self.idle_s = idle_s  # how often to look while no overlay is held
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agent-power-fallback", daemon=True)

    def check_once(self) -> list[str]:
        lapsed = self.store.lapsed_now()
        if lapsed:
            self.request_pass(f"power guard overlays lapsed ({', '.join(lapsed)}): safe caps")
        return lapsed

    def _loop(self) -> None:
        while True:
            period = self.store.shortest_period_s()
            if self._stop.wait(self.idle_s if period is None else period / 4):
                return
            try:
                self.check_once()
            except Exception:
                log.exception("power fallback watch failed")

    def start(self) -> FallbackWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()


def read_overlays(path: Path) -> dict[str, Overlay]:
    """What ``OverlayStore`` kept in ``path``: group -> overlay. A missing file is none; an unreadable
    one, or an entry that is no valid overlay, is logged and left out (that group's GPUs are then at
    their annotation caps until the guard's next overlay)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.error("cannot read the power guard's overlays kept in %s (%s)", path, exc)
        return {}
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        log.error("the power guard's overlays kept in %s are unreadable (%s); ignored", path, exc)
        return {}
    out: dict[str, Overlay] = {}
    for group, entry in data.items():
        try:
            overlay = Overlay.model_validate(entry)
        except ValueError as exc:
            log.error("the overlay kept for group %s in %s is invalid (%s); ignored", group, path,
                      str(exc).splitlines()[0])
            continue
        if overlay.group == group:
            out[group] = overlay
    return out
