"""powerfleet.sim: trace replay of KV-routed LLM workers in simulated time.

Public API (what the Celery tasks call):

* ``read_trace(path, strict=False) -> Trace`` / ``iter_trace`` (``sim.trace``)
* ``replay(requests, workers, policy, seed, *, sla, speedup, window, jitter_ms, profile,
  engine, cap_fraction) -> ReplaySummary`` (``sim.replay``); ``prepare`` +
  ``replay_arrivals`` to prepare a window once and replay many policies
* ``RouterPolicy``, ``RouterOptions``, ``SLA``, ``parse_policy``, ``parse_router_options``,
  ``parse_sla`` (``sim.policy``)
* ``warm_snapshot`` (``sim.replay``) and ``Simulation`` (``sim.engine``): a warm-up replayed
  once and forked per candidate
* ``TimingProfile``, ``default_profile``, ``load_profile``, ``CapCurve`` (``sim.profile``)
* ``EngineConfig``, ``parse_engine`` (``sim.engine``)
* ``Pools``, ``DisaggSimulation`` (``sim.disagg``): a disaggregated deployment (prefill pool,
  decode pool, KV transfer); ``sim.disagg.replay`` / ``replay_batches`` / ``warm_snapshot``
  take a replica count or ``Pools``
"""

from powerfleet.sim.disagg import DisaggSimulation, Pools
from powerfleet.sim.engine import EngineConfig, Simulation, parse_engine
from powerfleet.sim.policy import SLA, RouterOptions, RouterPolicy, parse_policy, parse_router_options, parse_sla
from powerfleet.sim.profile import CapCurve, TimingProfile, default_profile, load_profile
from powerfleet.sim.replay import parse_window, prepare, replay, replay_arrivals, warm_snapshot
from powerfleet.sim.summary import REPLAY_SCHEMA, ReplaySummary
from powerfleet.sim.trace import Trace, TraceError, TraceRequest, iter_trace, read_trace, select_window

__all__ = [
    "REPLAY_SCHEMA", "SLA", "CapCurve", "DisaggSimulation", "EngineConfig", "Pools", "ReplaySummary", "RouterOptions", "RouterPolicy",
    "Simulation", "TimingProfile", "Trace", "TraceError", "TraceRequest", "default_profile", "iter_trace",
    "load_profile", "parse_engine", "parse_policy", "parse_router_options", "parse_sla", "parse_window",
    "prepare", "read_trace", "replay", "replay_arrivals", "select_window", "warm_snapshot",
]
