"""`powerfleet sim ...` commands: replay a recorded trace under one router policy.

The options `sim replay` shares with `retune sweep` are declared once here (``*Opt``) and
parsed once (``ReplayInputs.load``), so their help and their checks cannot drift apart.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from powerfleet.cli.errors import fail, print_json

app = typer.Typer(help="Trace-replay simulator of KV-routed LLM workers.", no_args_is_help=True)

MAX_WORKERS = 4096  # a replica per worker: far above any cluster this fleet drives

ENGINE_HELP = (
    "JSON engine settings: max_num_seqs, max_num_batched_tokens, kv_allocation (reserve|incremental), "
    "host_cache_blocks, disk_cache_blocks, shared_cache_blocks, *_load_ms_per_block."
)
ROUTER_HELP = (
    "JSON router options (Dynamo's names): router_queue_threshold, router_queue_policy (fcfs|lcfs|wspt), "
    "router_prefill_load_model (none|ais), kv_event_lag_ms, router_track_output_blocks, "
    "router_tie_break (lowest|random)."
)
SLA_HELP = 'Goodput SLA, e.g. {"ttft_ms": 2000, "itl_ms": 50} or {"e2e_ms": 30000}.'

TraceOpt = Annotated[Path, typer.Option("--trace", help="Mooncake JSON-lines trace, plain or gzip.")]
WorkersOpt = Annotated[int, typer.Option("--workers", help=f"Number of worker replicas (1 to {MAX_WORKERS}).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the random streams (shared by every replay).")]
WindowOpt = Annotated[
    str | None, typer.Option("--window", help="START_S:END_S slice of the trace, in seconds from its start.")
]
WarmupOpt = Annotated[
    float | None,
    typer.Option("--warmup-s", help="Seconds before the window replayed unscored first (default: one window "
                                    "length, the previous window; 0: cold start)."),
]
SlaOpt = Annotated[str | None, typer.Option("--sla", help=SLA_HELP)]
ProfileOpt = Annotated[
    Path | None, typer.Option("--profile", help="Timing profile JSON (tables); default: built-in.")
]
EngineOpt = Annotated[str | None, typer.Option("--engine", help=ENGINE_HELP)]
RouterOpt = Annotated[str | None, typer.Option("--router", help=ROUTER_HELP)]
StrictOpt = Annotated[bool, typer.Option("--strict", help="A malformed line or corrupt gzip member is fatal.")]
PrefillWorkersOpt = Annotated[
    int | None,
    typer.Option("--prefill-workers", help="Disaggregated: this many prefill workers, --workers is the decode "
                                           "pool (default: aggregated workers)."),
]
PrefillProfileOpt = Annotated[
    Path | None, typer.Option("--prefill-profile", help="Disaggregated: the prefill pool's profile (default: --profile's).")
]
KvLinkOpt = Annotated[
    float, typer.Option("--kv-transfer-gb-s", help="Disaggregated: the prefill -> decode KV link, GB/s (64: InfiniBand).")
]


def pools_opt(workers: int, prefill_workers: int | None, prefill_profile: Path | None, kv_gb_s: float,
              decode_profile: Any) -> Any:
    """``--workers`` alone, or with ``--prefill-workers`` the disaggregated pools (sim/disagg.py)."""
    from powerfleet.sim.disagg import Pools

    if prefill_workers is None:
        if prefill_profile is not None:
            bad("--prefill-profile needs --prefill-workers")
        return workers
    check_counts(prefill_workers=(prefill_workers, 1))
    if prefill_workers > MAX_WORKERS:
        bad(f"--prefill-workers must be <= {MAX_WORKERS}, got {prefill_workers}")
    pre = load_profile_opt(prefill_profile) if prefill_profile is not None else None
    try:
        return Pools(prefill_workers, workers, prefill_profile=pre, decode_profile=decode_profile,
                     kv_transfer_gb_s=kv_gb_s)
    except ValueError as exc:
        bad(f"--kv-transfer-gb-s: {exc}")


def bad(message: str) -> NoReturn:
    fail(message)


def load_requests(trace: Path, strict: bool) -> list[Any]:
    """Read a trace for a command; report skipped lines/members on stderr (one line each, capped)."""
    from powerfleet.sim.trace import TraceError, read_trace
    from powerfleet.textinput import InputError, is_pipe, read_pipe

    if is_pipe(trace):  # <(zcat ...) or a FIFO: read it whole (bounded, within the input timeout), then parse
        import tempfile

        try:
            data = read_pipe(trace)
        except InputError as exc:
            bad(f"--trace: {exc}")
        with tempfile.NamedTemporaryFile(prefix="powerfleet-trace-") as copy:
            copy.write(data)
            copy.flush()
            return load_requests(Path(copy.name), strict)
    if not trace.exists():
        bad(f"trace {str(trace)!r} does not exist")
    if trace.is_dir():
        bad(f"trace {str(trace)!r} is a directory")
    try:
        tr = read_trace(trace, strict=strict)
    except TraceError as exc:
        bad(str(exc))
    if not tr.requests:  # nothing usable: one line, naming the first problem if any
        why = f" (first problem: {tr.issues[0]})" if tr.issues else ""
        bad(f"trace {str(trace)!r} holds no valid request{why}")
    for issue in tr.issues[:20]:
        typer.echo(f"powerfleet: warning: {issue} (skipped)", err=True)
    if len(tr.issues) > 20:
        typer.echo(f"powerfleet: warning: {len(tr.issues) - 20} more trace problems skipped", err=True)
    return tr.requests


def check_counts(**counts: tuple[int | None, int]) -> None:
    """One-line errors for integer options below their minimum (name=(value, minimum))."""
    for name, (value, minimum) in counts.items():
        if value is not None and value < minimum:
            bad(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


@dataclass
class ReplayInputs:
    """The shared options of `sim replay` and `retune sweep`, validated; errors name the option."""

    policy: Any
    sla: Any
    window: Any
    warmup_s: float | None
    profile: Any
    engine: Any
    router: Any
    requests: list[Any]

    @classmethod
    def load(cls, *, trace: Path, workers: int, seed: int, policy: str | None, policy_opt: str,
             sla: str | None, window: str | None, warmup_s: float | None, profile: Path | None,
             engine: str | None, router: str | None, strict: bool) -> ReplayInputs:
        from powerfleet.sim.engine import parse_engine
        from powerfleet.sim.policy import parse_policy, parse_router_options, parse_sla
        from powerfleet.sim.replay import parse_window

        check_counts(workers=(workers, 1), seed=(seed, 0))
        if workers > MAX_WORKERS:
            bad(f"--workers must be <= {MAX_WORKERS}, got {workers}")
        if warmup_s is not None and not (warmup_s >= 0 and warmup_s != float("inf")):
            bad(f"--warmup-s must be a finite number >= 0, got {warmup_s}")
        try:
            pol = parse_policy(policy, what=policy_opt)
            sl = parse_sla(sla, what="--sla")
            win = parse_window(window)
            eng = parse_engine(engine, what="--engine")
            rt = parse_router_options(router, what="--router")
        except ValueError as exc:
            bad(str(exc))
        prof = load_profile_opt(profile)
        return cls(pol, sl, win, warmup_s, prof, eng, rt, load_requests(trace, strict))


def load_profile_opt(profile: Path | None) -> Any:
    from powerfleet.sim.profile import default_profile, load_profile

    if profile is None:
        return default_profile()
    try:
        return load_profile(profile)
    except ValueError as exc:
        bad(str(exc))
    except RecursionError:
        bad(f"--profile: {profile} is nested too deeply to parse")


def _fmt_stats(name: str, s: Any) -> str:
    if s.mean is None:
        return f"{name:<5} (no samples)"
    return f"{name:<5} mean {s.mean:10.1f}  p50 {s.p50:10.1f}  p90 {s.p90:10.1f}  p99 {s.p99:10.1f} ms"


@app.command("replay")
def replay_cmd(
    trace: TraceOpt,
    workers: WorkersOpt,
    policy: str | None = typer.Option(None, "--policy", help="JSON object with any of the eight router parameters."),
    seed: SeedOpt = 0,
    speedup: float = typer.Option(1.0, "--speedup", help="Divide inter-arrival times by this factor."),
    window: WindowOpt = None,
    warmup_s: WarmupOpt = None,
    sla: SlaOpt = None,
    jitter_ms: float = typer.Option(0.0, "--jitter-ms", help="Uniform arrival jitter in [0, X) ms (policy independent)."),
    cap: float = typer.Option(1.0, "--cap-fraction", help="GPU power cap as a fraction of default TDP (slows steps)."),
    profile: ProfileOpt = None,
    engine: EngineOpt = None,
    router: RouterOpt = None,
    prefill_workers: PrefillWorkersOpt = None,
    prefill_profile: PrefillProfileOpt = None,
    kv_transfer_gb_s: KvLinkOpt = 64.0,
    strict: StrictOpt = False,
    as_json: bool = typer.Option(False, "--json", help="Print the powerfleet.sim.replay/v1 JSON summary."),
) -> None:
    """Replay a trace over N workers (or a prefill and a decode pool) under one router policy and summarise it."""
    from powerfleet.sim import disagg
    from powerfleet.sim.replay import replay

    inp = ReplayInputs.load(trace=trace, workers=workers, seed=seed, policy=policy, policy_opt="--policy",
                            sla=sla, window=window, warmup_s=warmup_s, profile=profile, engine=engine,
                            router=router, strict=strict)
    pools = pools_opt(workers, prefill_workers, prefill_profile, kv_transfer_gb_s, inp.profile)
    run = replay if isinstance(pools, int) else disagg.replay
    try:
        summary = run(
            inp.requests, pools, inp.policy, seed, sla=inp.sla, speedup=speedup, window=inp.window,
            jitter_ms=jitter_ms, profile=inp.profile, engine=inp.engine, cap_fraction=cap, router=inp.router,
            warmup_s=inp.warmup_s,
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
    if isinstance(s, disagg.DisaggSummary):
        d = s.disaggregated
        out.write(f"disaggregated: {d.prefill_workers} prefill ({d.prefill_profile}) + {d.decode_workers} decode "
                  f"({d.decode_profile}) workers, KV link {d.kv_transfer_gb_s:g} GB/s, "
                  + _fmt_stats("KV transfer", d.kv_transfer_ms).replace("KV transfer", "transfer", 1) + "\n")
