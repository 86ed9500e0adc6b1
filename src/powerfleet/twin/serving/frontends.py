"""The twin's frontends: a router policy endpoint, trace segments, load metrics and per-window TTFT.

Each ``TwinFrontend`` composes the retune fixture ``LoopbackFrontend`` (``GET/PATCH
/router_policy``) with what a Dynamo frontend does for the fleet:

* it serves the requests the traffic replay sends it and writes them as Mooncake JSON lines
  (``timestamp`` in epoch ms) in gzip segments under ``<trace_dir>/segments/<dgd>/<pod>/``,
  one member per batch, one file per ``SEGMENT_S`` seconds (what ``retune.cut`` merges);
* it exposes the load a signal would read on its own ``/metrics`` (Prometheus text);
* at the end of every retune window it replays that window's requests through the
  simulator's router and engine model twice, with its current router policy and with the
  default policy, over the deployment's ready workers at their current cap (a disaggregated
  deployment as its prefill and decode pools): the TTFT of "retuned" against "fixed default
  settings" on the same window (the report's plot), and the window's mean inter-token latency
  under its current policy (a scenario's ITL target).
"""

from __future__ import annotations

import gzip
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from powerfleet.sim.disagg import Pools, replay_batches
from powerfleet.sim.policy import RouterPolicy
from powerfleet.sim.replay import prepare
from powerfleet.sim.trace import TraceRequest
from powerfleet.twin.serving.frontend import LoopbackFrontend
from powerfleet.twin.apiserver.http import LoopbackHTTPServer

SEGMENT_S = 10


@dataclass(frozen=True)
class WindowTtft:
    dgd: str
    window: int
    start: float
    requests: int
    workers: int
    ttft_ms_current: float | None  # the frontend's policy during the window
    ttft_ms_default: float | None  # RouterPolicy() defaults, same requests, same seed
    policy: dict[str, float]
    itl_ms_current: float | None = None  # mean inter-token latency under the frontend's policy (None: not measured)


@dataclass
class _Counters:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    rate_rps: float = 0.0
    input_tps: float = 0.0
    output_tps: float = 0.0


class _MetricsHandler(BaseHTTPRequestHandler):
    server: _MetricsServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet fixture
        pass

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.server.frontend.metrics_text().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _MetricsServer(LoopbackHTTPServer):
    frontend: TwinFrontend


@dataclass
class TwinFrontend:
    dgd: str
    pod: str
    trace_dir: Path
    window_s: int
    seed: int = 0
    router: LoopbackFrontend = field(default_factory=LoopbackFrontend)
    counters: _Counters = field(default_factory=_Counters)
    windows: list[WindowTtft] = field(default_factory=list)
    _pending: list[tuple[float, TraceRequest]] = field(default_factory=list)  # (epoch s, request) this window
    _window: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _metrics: _MetricsServer | None = None

    def start(self) -> TwinFrontend:
        self.router.start()
        self._metrics = _MetricsServer(("127.0.0.1", 0), _MetricsHandler)
        self._metrics.frontend = self
        threading.Thread(target=self._metrics.serve_forever, kwargs={"poll_interval": 0.1},
                         name=f"twin-metrics-{self.pod}", daemon=True).start()
        return self

    def stop(self) -> None:
        self.router.stop()
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics.server_close()
            self._metrics = None

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def metrics_url(self) -> str:
        assert self._metrics is not None
        return f"http://127.0.0.1:{self._metrics.server_address[1]}/metrics"

    @property
    def segment_dir(self) -> Path:
        return self.trace_dir / "segments" / self.dgd / self.pod

    # -- serving --

    def serve(self, arrivals: list[tuple[float, TraceRequest]], dt_s: float) -> None:
        """Accept the requests that arrived in the last ``dt_s`` seconds, as (epoch s, request)."""
        requests = [r for _, r in arrivals]
        with self._lock:
            c = self.counters
            c.requests += len(requests)
            isl = sum(r.input_length for r in requests)
            osl = sum(r.output_length for r in requests)
            c.input_tokens += isl
            c.output_tokens += osl
            a = min(1.0, dt_s / 5.0)  # 5 s exponential average: what a rate() over the scrape would show
            c.rate_rps += a * (len(requests) / max(dt_s, 1e-6) - c.rate_rps)
            c.input_tps += a * (isl / max(dt_s, 1e-6) - c.input_tps)
            c.output_tps += a * (osl / max(dt_s, 1e-6) - c.output_tps)
            self._pending.extend(arrivals)
        if arrivals:
            self._write_segment(arrivals)

    def _write_segment(self, arrivals: list[tuple[float, TraceRequest]]) -> None:
        self.segment_dir.mkdir(parents=True, exist_ok=True)
        path = self.segment_dir / f"seg-{int(arrivals[0][0] // SEGMENT_S) * SEGMENT_S}.jsonl.gz"
        lines = "".join(json.dumps({"timestamp": int(t * 1000), "input_length": r.input_length,
                                    "output_length": r.output_length, "hash_ids": list(r.hash_ids)}) + "\n"
                        for t, r in arrivals)
        with open(path, "ab") as out:  # one gzip member per batch: a reader skips a torn last member
            out.write(gzip.compress(lines.encode(), mtime=0))

    def metrics_text(self) -> str:
        c = self.counters
        labels = f'dynamo_namespace="{self.dgd}",pod="{self.pod}"'
        last = self.windows[-1] if self.windows else None
        lines = [
            "# TYPE dynamo_frontend_requests_total counter",
            f"dynamo_frontend_requests_total{{{labels}}} {c.requests}",
            "# TYPE dynamo_frontend_input_tokens_total counter",
            f"dynamo_frontend_input_tokens_total{{{labels}}} {c.input_tokens}",
            "# TYPE dynamo_frontend_output_tokens_total counter",
            f"dynamo_frontend_output_tokens_total{{{labels}}} {c.output_tokens}",
            "# TYPE dynamo_frontend_request_rate gauge",
            f"dynamo_frontend_request_rate{{{labels}}} {c.rate_rps:.4f}",
        ]
        if last is not None and last.ttft_ms_current is not None:
            lines += ["# TYPE dynamo_frontend_time_to_first_token_seconds gauge",
                      f"dynamo_frontend_time_to_first_token_seconds{{{labels}}} {last.ttft_ms_current / 1000:.4f}"]
        return "\n".join(lines) + "\n"

    # -- per-window engine replay --

    def close_windows(self, now: float, workers: int, cap_fraction: float, prefill: int | None = None,
                      prefill_cap_fraction: float | None = None) -> WindowTtft | None:
        """At a window boundary, replay the finished window; returns its figures (None mid-window).
        ``prefill``: a disaggregated deployment's ready prefill workers (``workers``: its decode
        workers, at ``cap_fraction``), replayed as its two pools, as retune sweeps it
        (sim/disagg.py); the prefill pool at ``prefill_cap_fraction`` (None: ``cap_fraction``)."""
        k = int(now // self.window_s)
        if self._window is None:
            self._window = k
            return None
        if k == self._window:
            return None
        with self._lock:
            start = self._window * self.window_s
            batch = [(t, r) for t, r in self._pending if t < start + self.window_s]
            self._pending = [(t, r) for t, r in self._pending if t >= start + self.window_s]
            done, self._window = self._window, k
        policy = self.router.policy
        reqs = [TraceRequest((t - start) * 1000.0, r.input_length, r.output_length, r.hash_ids) for t, r in batch]
        current = default = itl = None
        if reqs and workers > 0 and prefill != 0:
            cap = min(max(cap_fraction, 0.2), 1.0)
            arr = prepare(reqs, seed=self.seed + done)
            pre_cap = None if prefill_cap_fraction is None else min(max(prefill_cap_fraction, 0.2), 1.0)
            pools = workers if prefill is None else Pools(prefill, workers, prefill_cap_fraction=pre_cap)
            summary = replay_batches(arr, pools, policy, self.seed + done, cap_fraction=cap)[0]
            current = summary.ttft_ms.mean
            itl = summary.itl_ms.mean  # None: no request decoded past its first token
            default = replay_batches(arr, pools, RouterPolicy(), self.seed + done, cap_fraction=cap)[0].ttft_ms.mean
        out = WindowTtft(self.dgd, done, start, len(reqs), workers, current, default, policy.model_dump(), itl)
        self.windows.append(out)
        return out
