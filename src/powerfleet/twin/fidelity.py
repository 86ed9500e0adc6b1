"""The twin's fidelity switches: where it behaves like a real cluster (docs/twin.md, "Fidelity").

``KEEP_FOREIGN_DGD_STATUS`` is False, the faithful behaviour: Dynamo's DGD CRD declares fixed
status fields, so the loopback server prunes (and validates) a DGD's status on every write, as a
real API server does, and the twin's operator replaces the whole status it owns (a typed
``Status().Update``), so a foreign key vanishes at its next write. It was True while powerfleet's
budget kept ``status.budget`` on the DGD; the budget now keeps its status in a ConfigMap per
deployment (issue 18, cluster/budget_store.py). ``ApiServer(options=ServerOptions(
prune_dgd_status=False))`` / ``OperatorSettings(keep_foreign_status=True)`` bring back the lenient
twin for a test that needs one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

KEEP_FOREIGN_DGD_STATUS = False

# Seconds from a pod's start to Ready, per component type (a model server loads its weights; a
# frontend is quick). The demo uses these; tests pass their own (0: Ready at the next pass).
DEMO_STARTUP_DELAY_S: Mapping[str, float] = MappingProxyType(
    {"frontend": 1.0, "planner": 1.0, "prefill": 4.0, "decode": 4.0, "worker": 4.0})
# kubelet's default terminationGracePeriodSeconds; the twin's pods hold their GPUs this long.
DEFAULT_TERMINATION_GRACE_S = 30


@dataclass(frozen=True)
class OperatorSettings:
    """What the twin's operator and kubelet do with time and foreign status keys."""

    # Startup delay by component name, else by component type, else ``"*"``, else 0.
    startup_delay_s: Mapping[str, float] = field(default_factory=dict)
    keep_foreign_status: bool = KEEP_FOREIGN_DGD_STATUS
    # Written on each pod as spec.terminationGracePeriodSeconds (the API server honours it).
    termination_grace_s: int = DEFAULT_TERMINATION_GRACE_S

    def delay_for(self, name: str, ctype: str) -> float:
        for key in (name, ctype, "*"):
            if key in self.startup_delay_s:
                return max(0.0, float(self.startup_delay_s[key]))
        return 0.0


def demo_operator_settings(duration_s: float) -> OperatorSettings:
    """The demo's twin: startup delays, and the 30 s grace period for runs of 180 s or more; a
    shorter run scales the grace to a sixth of its length so its scenario fits (a 60 s run had
    the budget hold its staged scale-up behind 30 s terminating pods past the end)."""
    return OperatorSettings(startup_delay_s=DEMO_STARTUP_DELAY_S,
                            termination_grace_s=int(min(DEFAULT_TERMINATION_GRACE_S, duration_s / 6)))
