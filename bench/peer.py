"""Fidelity against NVIDIA Dynamo's own replay (needs the optional extra: pip install -e '.[peer]').

1. fidelity: for the default router settings, four others, and each of Dynamo's router options
   switched on alone, replays the same slices (the first 1,800 s of the conversation trace,
   the whole synthetic trace) in powerfleet and in Dynamo (several runs: Dynamo's tie-break
   is not seeded) and prints mean / p50 / p90 TTFT, block hit rate and wall time, and
   whether powerfleet lies within Dynamo's band widened by 3 % (TTFT) or 1 point (hit rate).
2. disagg: the same for disaggregated replays (a prefill and a decode pool, the KV transfer
   between them) against the peer's disaggregated replay, over pool sizes, settings and links.
3. retune: sweeps a window, then replays its choice and the defaults on the next window in
   both simulators (warm-started by the window swept), so a decision is checked by a
   simulator powerfleet did not write.

Usage: python bench/peer.py [--runs 3] [--part fidelity|disagg|retune|all] [--workers 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from powerfleet.retune.grid import DEFAULT_GRID
from powerfleet.retune.sweep import run_sweep
from powerfleet.sim import peer
from powerfleet.sim.disagg import Pools
from powerfleet.sim.engine import EngineConfig
from powerfleet.sim.policy import RouterOptions, RouterPolicy
from powerfleet.sim.profile import default_profile
from powerfleet.sim.trace import TraceRequest, read_trace, select_window

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
SETTINGS: dict[str, RouterPolicy] = {
    "default": RouterPolicy(),
    "credit 0": RouterPolicy(overlap_score_credit=0.0),
    "scale 0.5": RouterPolicy(prefill_load_scale=0.5),
    "credit 0, scale 0": RouterPolicy(overlap_score_credit=0.0, prefill_load_scale=0.0),
    "credit 2, scale 4": RouterPolicy(overlap_score_credit=2.0, prefill_load_scale=4.0),
}
# Dynamo's router options, each on alone (powerfleet's side uses the same names)
OPTIONS: dict[str, tuple[RouterOptions, EngineConfig]] = {
    "queue 1.0 fcfs": (RouterOptions(router_queue_threshold=1.0), EngineConfig()),
    "prefill load ais": (RouterOptions(router_prefill_load_model="ais"), EngineConfig()),
    "kv events 200 ms late": (RouterOptions(kv_event_lag_ms=200.0), EngineConfig()),
    "track output blocks": (RouterOptions(router_track_output_blocks=True), EngineConfig()),
    "random ties": (RouterOptions(router_tie_break="random"), EngineConfig()),
    "incremental KV": (RouterOptions(), EngineConfig(kv_allocation="incremental")),
}


def band_check(ours: float, lo: float, hi: float, rel: float = 0.0, abs_: float = 0.0) -> str:
    slack_lo = lo * (1 - rel) - abs_
    slack_hi = hi * (1 + rel) + abs_
    return "ok" if slack_lo <= ours <= slack_hi else "OUT"


def compare(name: str, reqs: list[TraceRequest], workers: int, pol: RouterPolicy, opts: RouterOptions,
            eng: EngineConfig, table: Path, runs: int, scored_from_ms: float = 0.0,
            pools: Pools | None = None) -> dict[str, Any]:
    prof = default_profile()
    blocks = prof.kv_capacity_tokens // eng.block_tokens
    dyn = [peer.run_peer(reqs, workers, pol, table=table, kv_blocks=blocks, options=opts, engine=eng,
                         scored_from_ms=scored_from_ms, pools=pools) for _ in range(runs)]
    # With random ties powerfleet's run is one draw too: average its figures over as many seeds.
    seeds = range(runs) if opts.router_tie_break == "random" else range(1)
    mine = [peer.run_ours(reqs, workers, pol, options=opts, engine=eng, scored_from_ms=scored_from_ms, seed=s,
                          pools=pools) for s in seeds]
    ours = peer.Metrics(**{k: (sum(getattr(m, k) for m in mine) / len(mine)) if k != "requests" else mine[0].requests
                           for k in peer.Metrics.__dataclass_fields__})
    row: dict[str, Any] = {"case": name, "ours": ours.as_dict(), "ours_seeds": len(mine),
                           "ours_mean_ttft_range": [round(min(m.mean_ttft_ms for m in mine), 1),
                                                    round(max(m.mean_ttft_ms for m in mine), 1)]}
    for key in ("mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms", "block_hit_rate", "wall_s", "preemptions"):
        vals = [getattr(d, key) for d in dyn]
        row[f"dynamo_{key}"] = [round(min(vals), 4), round(max(vals), 4)]
    for key in ("mean_ttft_ms", "p90_ttft_ms"):
        lo, hi = row[f"dynamo_{key}"]
        row[f"{key}_within_3pct"] = band_check(getattr(ours, key), lo, hi, rel=0.03)
    lo, hi = row["dynamo_block_hit_rate"]
    row["hit_within_1pt"] = band_check(ours.block_hit_rate, lo, hi, abs_=0.01)
    return row


def fmt(row: dict[str, Any]) -> str:
    o = row["ours"]
    d = row
    return (
        f"{row['case']:<44} mean {o['mean_ttft_ms']:8.1f} vs {d['dynamo_mean_ttft_ms'][0]:8.1f}-"
        f"{d['dynamo_mean_ttft_ms'][1]:8.1f} [{row['mean_ttft_ms_within_3pct']}]  p50 {o['p50_ttft_ms']:7.1f} vs "
        f"{d['dynamo_p50_ttft_ms'][0]:7.1f}-{d['dynamo_p50_ttft_ms'][1]:7.1f}  p90 {o['p90_ttft_ms']:7.1f} vs "
        f"{d['dynamo_p90_ttft_ms'][0]:7.1f}-{d['dynamo_p90_ttft_ms'][1]:7.1f} [{row['p90_ttft_ms_within_3pct']}]  "
        f"hit {o['block_hit_rate']:.3f} vs {d['dynamo_block_hit_rate'][0]:.3f}-{d['dynamo_block_hit_rate'][1]:.3f} "
        f"[{row['hit_within_1pt']}]  wall {o['wall_s']:.2f} vs "
        f"{d['dynamo_wall_s'][0]:.2f}-{d['dynamo_wall_s'][1]:.2f} s"
        f"  preempt {o['preemptions']} vs {d['dynamo_preemptions'][0]}-{d['dynamo_preemptions'][1]}"
    )


def fidelity(slices: dict[str, list[TraceRequest]], workers: int, table: Path, runs: int,
             matched: bool = False) -> list[dict[str, Any]]:
    """``matched``: powerfleet breaks ties at random too (from its seeded stream), as Dynamo does."""
    rows = []
    base = RouterOptions(router_tie_break="random") if matched else RouterOptions()
    for sname, reqs in slices.items():
        cases = [(f"{sname}: {k}", pol, base, EngineConfig()) for k, pol in SETTINGS.items()]
        cases += [(f"{sname}: default + {k}", RouterPolicy(),
                   o.model_copy(update={"router_tie_break": "random"}) if matched else o, e)
                  for k, (o, e) in OPTIONS.items() if not (matched and k == "random ties")]
        for name, pol, opts, eng in cases:
            try:
                row = compare(name, reqs, workers, pol, opts, eng, table, runs)
            except Exception as exc:  # the peer refuses some options (e.g. ais needs AISimulate)
                print(f"{name:<44} peer refused: {exc}", flush=True)
                rows.append({"case": name, "peer_error": str(exc)})
                continue
            print(fmt(row), flush=True)
            rows.append(row)
    return rows


def disagg(slices: dict[str, list[TraceRequest]], table: Path, runs: int, matched: bool) -> list[dict[str, Any]]:
    """Disaggregated replays (sim/disagg.py) against the peer's (prefill and decode pools, its KV
    transfer at the same bytes per token and GB/s): pool sizes, settings and a slow link."""
    rows = []
    base = RouterOptions(router_tie_break="random") if matched else RouterOptions()
    cases = [("4P+4D: " + k, pol, Pools(4, 4)) for k, pol in SETTINGS.items()]
    cases += [("2P+6D: default", RouterPolicy(), Pools(2, 6)), ("6P+2D: default", RouterPolicy(), Pools(6, 2)),
              ("4P+4D: default, link 6.4 GB/s", RouterPolicy(), Pools(4, 4, kv_transfer_gb_s=6.4))]
    for sname, reqs in slices.items():
        for name, pol, pools in cases:
            row = compare(f"{sname}: {name}", reqs, pools.total, pol, base, EngineConfig(), table, runs, pools=pools)
            print(fmt(row), flush=True)
            rows.append(row)
    return rows


def retune(reqs: list[TraceRequest], workers: int, table: Path, runs: int, windows: list[tuple[float, float]],
           processes: int) -> list[dict[str, Any]]:
    """Sweep window k (warm-started), replay its choice and the defaults on window k+1."""
    rows = []
    t0 = min(r.timestamp_ms for r in reqs)
    for (a, b), (c, d) in zip(windows, windows[1:]):
        res = run_sweep(reqs, workers, "ttft", RouterPolicy(), DEFAULT_GRID, window=(a, b), processes=processes)
        choice = RouterPolicy(**res.decision.params)
        nxt = select_window(reqs, a, d)  # the swept window warms the next one up
        first = min(r.timestamp_ms for r in nxt)
        scored_from = t0 + c * 1000.0 - first
        out: dict[str, Any] = {"swept": [a, b], "next": [c, d], "params": {
            k: res.decision.params[k] for k in ("overlap_score_credit", "prefill_load_scale", "temperature")},
            "search_points": res.search_points, "action": res.decision.action}
        for name, pol in (("choice", choice), ("default", RouterPolicy())):
            ours = peer.run_ours(nxt, workers, pol, scored_from_ms=scored_from)
            dyn = [peer.run_peer(nxt, workers, pol, table=table, kv_blocks=2187, scored_from_ms=scored_from)
                   for _ in range(runs)]
            out[name] = {"ours_mean": round(ours.mean_ttft_ms, 1), "ours_p90": round(ours.p90_ttft_ms, 1),
                         "dynamo_mean": [round(min(x.mean_ttft_ms for x in dyn), 1),
                                         round(max(x.mean_ttft_ms for x in dyn), 1)],
                         "dynamo_p90": [round(min(x.p90_ttft_ms for x in dyn), 1),
                                        round(max(x.p90_ttft_ms for x in dyn), 1)]}
        ch, de = out["choice"], out["default"]
        out["gain_ours_pct"] = round(100 * (1 - ch["ours_mean"] / de["ours_mean"]), 1)
        dm = lambda v: sum(v) / 2  # noqa: E731  (band midpoint)
        out["gain_dynamo_pct"] = round(100 * (1 - dm(ch["dynamo_mean"]) / dm(de["dynamo_mean"])), 1)
        print(json.dumps(out), flush=True)
        rows.append(out)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="Dynamo runs per case (its tie-break is not seeded)")
    ap.add_argument("--part", choices=("fidelity", "retune", "disagg", "all"), default="all")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", help="also write the rows as JSON here")
    ap.add_argument("--matched", action="store_true", help="powerfleet breaks ties at random, as Dynamo does")
    args = ap.parse_args()
    if not peer.available():
        sys.exit("the peer is not installed: pip install -e '.[peer]' (ai-dynamo-runtime==1.6.1)")
    conv = read_trace(TRACES / "conversation_trace.jsonl.gz").requests
    synth = read_trace(TRACES / "synthetic_trace.jsonl").requests
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        table = peer.write_timing_table(default_profile(), Path(d) / "timing.npz")
        if args.part in ("fidelity", "all"):
            slices = {"conversation 0:1800": select_window(conv, 0, 1800), "synthetic": synth}
            out["fidelity"] = fidelity(slices, args.workers, table, args.runs, args.matched)
        if args.part in ("disagg", "all"):
            slices = {"conversation 0:1800": select_window(conv, 0, 1800), "synthetic": synth}
            out["disagg"] = disagg(slices, table, args.runs, args.matched)
        if args.part in ("retune", "all"):
            wins = [(0.0, 1200.0), (1200.0, 2400.0), (2400.0, 3537.0)]
            out["retune"] = retune(conv, args.workers, table, args.runs, wins, args.processes)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
