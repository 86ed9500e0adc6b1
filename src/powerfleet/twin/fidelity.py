"""The twin's fidelity switches: where it behaves like a real cluster, and the one place to flip
what is still lenient (docs/twin.md, "Fidelity").

``KEEP_FOREIGN_DGD_STATUS`` is the only lenient default left, and it exists for one fleet
defect: powerfleet's budget writes ``status.budget`` on the DGD, a field Dynamo's CRD does not
declare. A real API server prunes it at every write and Dynamo's operator (a typed
``Status().Update``) drops it at its next reconcile. Until the budget keeps its status in its
own object (issue 18), the twin keeps foreign DGD status keys: the loopback server does not
prune the DGD's status, and the twin's operator carries foreign keys over. Flip it to False
(or pass ``ApiServer(prune_dgd_status=True)`` / ``OperatorSettings(keep_foreign_status=False)``)
for the faithful behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

KEEP_FOREIGN_DGD_STATUS = True

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
