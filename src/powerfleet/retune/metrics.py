"""The ``powerfleet_retune_*`` metric families (docs/configuration.md lists them)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

WINDOWS = Counter("powerfleet_retune_windows_total",
                  "Retune windows by event (launched, decided, abandoned, dropped, blocked, no-traffic) and reason",
                  ["deployment", "event", "reason"])
DECISIONS = Counter("powerfleet_retune_decisions_total", "Saved decisions by outcome and failure reason",
                    ["deployment", "outcome", "failure_reason"])
SWEEP_SECONDS = Histogram("powerfleet_retune_sweep_duration_seconds", "Launch to harvest of a sweep",
                          ["deployment"], buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200))
CANDIDATES = Counter("powerfleet_retune_candidates_total", "Sweep candidates by outcome (scored, failed, missing)",
                     ["deployment", "outcome"])
IMPROVEMENT = Gauge("powerfleet_retune_chosen_improvement_percent", "Improvement of the last applied decision",
                    ["deployment"], multiprocess_mode="mostrecent")
CONVERGED = Gauge("powerfleet_retune_routers_converged", "Frontends on their target settings at the last round",
                  ["deployment"], multiprocess_mode="mostrecent")
ROUTERS = Gauge("powerfleet_retune_routers", "Frontends seen at the last round", ["deployment"],
                multiprocess_mode="mostrecent")
TERM = Gauge("powerfleet_retune_leader_term", "Leader term this process holds (0: not the leader)", ["deployment"],
             multiprocess_mode="mostrecent")
CORRUPT_STATE = Counter("powerfleet_retune_corrupt_state_total", "Corrupt saved states found and replaced",
                        ["deployment"])
APPLIED = Gauge("powerfleet_retune_applied_value", "Router parameter values retune wants every frontend to hold "
                "(the saved decision; absent while nothing is decided)", ["deployment", "parameter"],
                multiprocess_mode="mostrecent")
EVENTS_FAILED = Counter("powerfleet_retune_events_failed_total", "Kubernetes Events retune could not record",
                        ["deployment"])
