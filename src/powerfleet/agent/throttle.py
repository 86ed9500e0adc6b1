"""The power guard's overlays inside the agent (issue 22; docs/power.md, "Live").

``OverlayStore`` keeps the last overlay per group with the time it was received on the agent's
own clock, and resolves the cap a GPU gets with ``power.overlay.agent_cap``: while the group's
overlay is fresh, ``min(annotation cap, throttle cap)``; once it is not (guard, beat or Redis
gone), the GPU's safe cap, held until a fresh overlay arrives. The pass calls
``OverlayStore.limit_mw`` where it has resolved a GPU's cap (the hook in ``agent.reconcile``).

``FallbackWatch`` is the thread that makes the fallback bind within one period: it looks at the
store every quarter period and asks for a pass when a group's overlay has just lapsed, so the
agent does not wait for its next tick (15 s) to move the GPUs to their safe caps.

What an agent does not keep: the overlays live in the process. An agent that restarts while the
guard is down enforces the annotation caps until the guard is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from powerfleet.clock import Clock
from powerfleet.power.overlay import GRACE, AgentCap, Overlay, agent_cap

log = logging.getLogger("powerfleet.agent")


@dataclass(frozen=True)
class Held:
    overlay: Overlay
    received_at: float  # the agent's monotonic clock


class OverlayStore:
    """The last overlay per group (thread-safe: the task thread writes, the pass and the watch read)."""

    def __init__(self, clock: Clock, registry: CollectorRegistry | None = None) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}
        self._lapsed: set[str] = set()  # groups whose overlay has lapsed (seen by lapsed_now)
        r = registry if registry is not None else CollectorRegistry()
        self.fallbacks = Counter("powerfleet_agent_power_fallback_activations_total",
                                 "Times a group's overlays stopped and its GPUs went to their safe caps",
                                 ["group"], registry=r)
        self.in_fallback = Gauge("powerfleet_agent_power_fallback", "1 while a group's GPUs are at their safe caps",
                                 ["group"], registry=r)

    def receive(self, overlay: Overlay) -> bool:
        """Keep ``overlay`` unless an overlay of a newer revision is already held; True when kept."""
        now = self.clock.monotonic()
        with self._lock:
            held = self._held.get(overlay.group)
            if held is not None and overlay.revision < held.overlay.revision:
                return False
            self._held[overlay.group] = Held(overlay, now)
            if overlay.group in self._lapsed:
                self._lapsed.discard(overlay.group)
                self.in_fallback.labels(group=overlay.group).set(0)
                log.info("group %s: the guard's overlays are back; caps follow them again", overlay.group)
            return True

    def _fresh(self, held: Held, now: float) -> bool:
        return now - held.received_at <= held.overlay.period_s * (1.0 + GRACE)

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
            log.warning("group %s: no overlay from the power guard for %.1fs (period %gs); its GPUs go to their "
                        "safe caps until the guard is back", group, now - self._held[group].received_at,
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
