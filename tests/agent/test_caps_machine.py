"""Issue 32's state machine, bounded (the long run: bench/agent_explore.py): passes, restarts
with and without a SIGKILL between set and save, pod phases, allocations, re-enumerations,
driver faults, host processes and MPS servers (clients listed by the driver or not) over the real
NodeAgent and NVML port; the invariants are checked after every step
(powerfleet/testing/agent_machine.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from powerfleet.testing.agent_machine import CapsMachine

TestCapsMachine = CapsMachine.TestCase
TestCapsMachine.settings = settings(max_examples=200, stateful_step_count=30, deadline=None, derandomize=True,
                                    database=None, suppress_health_check=[HealthCheck.too_slow])
