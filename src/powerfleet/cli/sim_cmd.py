"""`powerfleet sim ...` commands: replay a recorded trace under one router policy."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import typer

from powerfleet.cli.errors import fail, print_json

app = typer.Typer(help="Trace-replay simulator of KV-routed LLM workers.", no_args_is_help=True)


def bad(message: str) -> NoReturn:
    fail(message)


def load_requests(trace: Path, strict: bool) -> list[Any]:
    """Read a trace for a command; report skipped lines/members on stderr (one line each, capped)."""
    from powerfleet.sim.trace import TraceError, read_trace

    if not trace.exists():
        bad(f"trace {str(trace)!r} does not exist")
    if trace.is_dir():
        bad(f"trace {str(trace)!r} is a directory")
    try:
        tr = read_trace(trace, strict=strict)
    except TraceError as exc:
        bad(str(exc))
    for issue in tr.issues[:20]:
        typer.echo(f"powerfleet: warning: {issue} (skipped)", err=True)
    if len(tr.issues) > 20:
        typer.echo(f"powerfleet: warning: {len(tr.issues) - 20} more trace problems skipped", err=True)
    if not tr.requests:
        bad(f"trace {str(trace)!r} holds no valid request")
    return tr.requests


def check_counts(**counts: tuple[int | None, int]) -> None:
    """One-line errors for integer options below their minimum (name=(value, minimum))."""
    for name, (value, minimum) in counts.items():
        if value is not None and value < minimum:
            bad(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def parse_common(policy: str | None, sla: str | None, window: str | None) -> tuple[Any, Any, Any]:
    from powerfleet.sim.policy import parse_policy, parse_sla
    from powerfleet.sim.replay import parse_window

    try:
        pol = parse_policy(policy)
        sl = parse_sla(sla)
        win = parse_window(window)
    except ValueError as exc:
        bad(str(exc))
    return pol, sl, win


def parse_engine_opt(engine: str | None) -> Any:
    from powerfleet.sim.engine import parse_engine

    try:
        return parse_engine(engine)
    except ValueError as exc:
        bad(str(exc))


ENGINE_HELP = (
    "JSON engine settings: max_num_seqs, max_num_batched_tokens, host_cache_blocks, "
    "disk_cache_blocks, shared_cache_blocks, *_load_ms_per_block."
)


def load_profile_opt(profile: Path | None) -> Any:
    from powerfleet.sim.profile import default_profile, load_profile

    if profile is None:
        return default_profile()
    try:
        return load_profile(profile)
    except ValueError as exc:
        bad(str(exc))


def _fmt_stats(name: str, s: Any) -> str:
    if s.mean is None:
        return f"{name:<5} (no samples)"
    return f"{name:<5} mean {s.mean:10.1f}  p50 {s.p50:10.1f}  p90 {s.p90:10.1f}  p99 {s.p99:10.1f} ms"


@app.command("replay")
def replay_cmd(
    trace: Path = typer.Option(..., "--trace", help="Mooncake JSON-lines trace, plain or gzip."),
    workers: int = typer.Option(..., "--workers", help="Number of worker replicas."),
    policy: str | None = typer.Option(None, "--policy", help="JSON object with any of the eight router parameters."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random streams."),
    speedup: float = typer.Option(1.0, "--speedup", help="Divide inter-arrival times by this factor."),
    window: str | None = typer.Option(None, "--window", help="START_S:END_S slice of the trace, in seconds from its start."),
    sla: str | None = typer.Option(None, "--sla", help='Goodput SLA, e.g. {"ttft_ms": 2000, "itl_ms": 50} or {"e2e_ms": 30000}.'),
    jitter_ms: float = typer.Option(0.0, "--jitter-ms", help="Uniform arrival jitter in [0, X) ms (policy independent)."),
    cap: float = typer.Option(1.0, "--cap-fraction", help="GPU power cap as a fraction of default TDP (slows steps)."),
    profile: Path | None = typer.Option(None, "--profile", help="Timing profile JSON (tables); default: built-in."),
    engine: str | None = typer.Option(None, "--engine", help=ENGINE_HELP),
    strict: bool = typer.Option(False, "--strict", help="A malformed line or corrupt gzip member is fatal."),
    as_json: bool = typer.Option(False, "--json", help="Print the powerfleet.sim.replay/v1 JSON summary."),
) -> None:
    """Replay a trace over N workers under one router policy and summarise it."""
    from powerfleet.sim.replay import replay

    check_counts(workers=(workers, 1), seed=(seed, 0))
    pol, sl, win = parse_common(policy, sla, window)
    prof = load_profile_opt(profile)
    eng = parse_engine_opt(engine)
    reqs = load_requests(trace, strict)
    try:
        summary = replay(
            reqs, workers, pol, seed, sla=sl, speedup=speedup, window=win,
            jitter_ms=jitter_ms, profile=prof, engine=eng, cap_fraction=cap,
        )
    except ValueError as exc:
        bad(str(exc))
    if as_json:
        print_json(summary.to_json_dict())
        return
    s = summary
    out = sys.stdout
    out.write(
        f"requests {s.requests}  completed {s.completed}  dropped {s.dropped}  "
        f"simulated {s.duration_s:.1f} s on {s.workers} workers ({s.gpus} GPUs, {s.profile})\n"
    )
    out.write(
        f"throughput {s.throughput_tok_s:.1f} tok/s  per GPU {s.throughput_per_gpu_tok_s:.1f}  "
        f"cache hit rate {s.cache_hit_rate if s.cache_hit_rate is not None else 'n/a'}  "
        f"load imbalance {s.load_imbalance}\n"
    )
    for name, st in (("TTFT", s.ttft_ms), ("ITL", s.itl_ms), ("E2E", s.e2e_ms)):
        out.write(_fmt_stats(name, st) + "\n")
    if s.goodput_req_s is not None:
        out.write(f"goodput {s.goodput_req_s:.3f} req/s ({s.goodput_requests} requests met the SLA)\n")
