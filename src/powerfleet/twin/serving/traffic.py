"""Traffic replay for the twin: recorded traces, time-compressed so a retune window is tens of seconds.

Compression keeps the *rate* real and compresses the *shape*: with ``speedup`` k, one wall
second covers k trace seconds, and only every k-th request of the trace is sent (which ones
depends on the seed). So the frontends, the sweeps and the engine model see the arrival rate
the trace recorded, while an hour of the trace's ups and downs passes in an hour / k. The
trace loops when it runs out.

Traces come from ``--traces DIR`` (or ``POWERFLEET_TWIN_TRACES``), else ``shared/traces``
beside the checkout. Without one, a synthetic Poisson trace with shared prefixes stands in,
and the report says so (``traffic.source``).
"""

from __future__ import annotations

import bisect
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

from powerfleet.sim.trace import TraceRequest, read_trace

TRACE_FILES = {"conversation": "conversation_trace.jsonl.gz", "synthetic": "synthetic_trace.jsonl"}
DEFAULT_SPEEDUP = 10


def find_traces(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The first directory holding the Mooncake traces: explicit, $POWERFLEET_TWIN_TRACES, or shared/traces."""
    candidates = [explicit, os.environ.get("POWERFLEET_TWIN_TRACES")]
    here = Path(__file__).resolve()
    candidates += [Path.cwd() / "../shared/traces", Path.cwd() / "shared/traces"]
    candidates += [p / "shared/traces" for p in here.parents[:7]]
    for c in candidates:
        if c and (Path(c) / TRACE_FILES["conversation"]).exists():
            return Path(c).resolve()
    return None


def synthetic_requests(seed: int, span_s: float = 3600.0, rate: float = 3.0) -> list[TraceRequest]:
    """A stand-in trace: Poisson arrivals, 40 shared system prompts, Mooncake-like lengths."""
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    t, next_id = 0.0, 1000
    while t < span_s * 1000:
        t += rng.expovariate(rate) * 1000
        prompt = rng.randrange(40)
        shared = [prompt * 16 + i for i in range(rng.randint(2, 12))]
        own = list(range(next_id, next_id + rng.randint(1, 10)))
        next_id += len(own)
        blocks = shared + own
        out.append(TraceRequest(t, len(blocks) * 512 - rng.randrange(512), rng.randint(20, 600), tuple(blocks)))
    return out


@dataclass
class TrafficSource:
    """One deployment's arrivals. ``due(elapsed_s)`` returns the requests sent since the last call."""

    requests: list[TraceRequest]  # the kept (thinned) requests, timestamps rebased to 0 ms
    speedup: float
    span_ms: float
    name: str
    _sent_until_ms: float = 0.0
    # The rate multiplier in force (a scenario's ``traffic.multipliers``): the trace plays this
    # many times as fast from the last call on, so its arrival rate is this many times the recorded.
    rate: float = 1.0
    _elapsed_s: float = 0.0

    def __post_init__(self) -> None:
        self._times = [r.timestamp_ms for r in self.requests]

    @classmethod
    def from_requests(cls, name: str, requests: list[TraceRequest], *, speedup: float = DEFAULT_SPEEDUP,
                      seed: int = 0, offset_s: float = 0.0) -> TrafficSource:
        if not requests:
            raise ValueError(f"traffic {name}: the trace has no requests")
        if not 1 <= speedup <= 1000:
            raise ValueError(f"traffic speedup must be between 1 and 1000, got {speedup}")
        ordered = sorted(requests, key=lambda r: r.timestamp_ms)
        t0 = ordered[0].timestamp_ms
        span = max(ordered[-1].timestamp_ms - t0, 1.0)
        step = max(1, int(round(speedup)))
        keep = seed % step
        # Rotate by the offset so two deployments replaying one trace do not move in lockstep.
        off = (offset_s * 1000.0) % span
        kept = [replace(r, timestamp_ms=(r.timestamp_ms - t0 - off) % span)
                for i, r in enumerate(ordered) if i % step == keep]
        kept.sort(key=lambda r: r.timestamp_ms)
        return cls(kept, float(speedup), span, name)

    def due(self, elapsed_s: float) -> list[TraceRequest]:
        """Requests whose compressed arrival is in (last call, elapsed_s]; trace time is elapsed * speedup."""
        until = self._sent_until_ms + max(0.0, elapsed_s - self._elapsed_s) * 1000.0 * self.speedup * self.rate
        self._elapsed_s = max(self._elapsed_s, elapsed_s)
        out: list[TraceRequest] = []
        start = self._sent_until_ms
        while start < until:
            lap, pos = divmod(start, self.span_ms)
            end_in_lap = min(until - lap * self.span_ms, self.span_ms)
            lo = bisect.bisect_left(self._times, pos)
            hi = bisect.bisect_left(self._times, end_in_lap) if end_in_lap < self.span_ms else len(self._times)
            out.extend(replace(r, timestamp_ms=r.timestamp_ms + lap * self.span_ms) for r in self.requests[lo:hi])
            start = lap * self.span_ms + end_in_lap
        self._sent_until_ms = until
        return out


def load_sources(traces: Path | None, *, speedup: float, seed: int) -> tuple[str, dict[str, TrafficSource]]:
    """(source description, {deployment: TrafficSource}) for the twin's two deployments."""
    from powerfleet.twin.cluster.manifests import AGG, DISAGG

    if traces is None:
        reqs = synthetic_requests(seed)
        return "synthetic (no trace directory found)", {
            DISAGG: TrafficSource.from_requests(DISAGG, reqs, speedup=speedup, seed=seed),
            AGG: TrafficSource.from_requests(AGG, reqs, speedup=speedup, seed=seed + 1, offset_s=1200),
        }
    conv = read_trace(traces / TRACE_FILES["conversation"]).requests
    # The conversation trace feeds both deployments, the aggregated one half an hour later:
    # its rate suits their sizes (the synthetic trace's long prompts would swamp a small twin).
    return f"{traces / TRACE_FILES['conversation']}", {
        DISAGG: TrafficSource.from_requests(DISAGG, conv, speedup=speedup, seed=seed),
        AGG: TrafficSource.from_requests(AGG, conv, speedup=speedup, seed=seed + 1, offset_s=1800),
    }
