"""bench/scale.py's table: one column per size, one row per figure (docs/benchmarks.md "Scale")."""

from __future__ import annotations

from typing import Any, Callable

Row = tuple[str, Callable[[dict[str, Any]], str]]


def _mb(x: float) -> str:
    return f"{x / 1e6:.1f} MB"


def _ticks(s: dict[str, Any], f: Callable[[dict[str, Any]], float], fmt: str) -> str:
    ticks = (s.get("reconcile") or {}).get("ticks") or []
    return " / ".join(t["failed"] if "failed" in t and not _kept(f, t) else format(f(t), fmt) for t in ticks) or "-"


def _kept(f: Callable[[dict[str, Any]], float], t: dict[str, Any]) -> bool:
    try:
        f(t)
        return True
    except KeyError:
        return False


def _get(path: str, fmt: str = "", scale: float = 1.0) -> Callable[[dict[str, Any]], str]:
    def read(s: dict[str, Any]) -> str:
        v: Any = s
        for part in path.split("."):
            if not isinstance(v, dict) or part not in v:
                return "-"
            v = v[part]
        return format(v if scale == 1.0 else v * scale, fmt) if isinstance(v, (int, float)) else str(v)
    return read


def _no_ttl(s: dict[str, Any]) -> str:
    kinds = (s.get("redis_after_ticks") or {}).get("keys_without_ttl")
    if kinds is None:
        return "-"
    bindings = sum(v for k, v in kinds.items() if k.startswith("kombu bindings"))
    return f"{bindings:,} kombu bindings + {sum(kinds.values()) - bindings} fleet keys"


def _hour(s: dict[str, Any]) -> str:
    rec = s.get("reconcile")
    if not rec:
        return "-"
    per, ticks_kept = rec["result_per_tick"], rec["result_expires_s"] / 15
    return (f"+{_mb(per * 240)} (240 results x {per / 1e3:.0f} kB); "
            f"{_mb(per * ticks_kept)} held at result_expires_s {rec['result_expires_s']}")


ROWS: list[Row] = [
    ("GPUs", _get("gpus", ",")),
    ("agent-simulating processes x queues", lambda s: f"{s['agent_workers']} x {s['queues_per_worker']}"
     if "agent_workers" in s else "-"),
    ("agent workers ready (s)", _get("workers_ready_s", ".1f")),
    ("reconcile tick: fan-out sent (s, per tick)", lambda s: _ticks(s, lambda t: t["tick_wall_s"], ".2f")),
    ("reconcile tick: control worker CPU (s)", lambda s: _ticks(s, lambda t: t["tick_cpu_s"], ".2f")),
    ("every pass ran within (s)", lambda s: _ticks(s, lambda t: t["all_passes_ran_s"], ".1f")),
    ("Redis CPU per tick (s)", lambda s: _ticks(s, lambda t: t["redis_cpu_s"], ".2f")),
    ("agent workers' CPU per tick (s)", lambda s: _ticks(s, lambda t: t["agents_cpu_s"], ".1f")),
    ("passes per node (min-max)", lambda s: _ticks(s, lambda t: t["passes_min"] * 1000 + t["passes_max"], "")
     .replace("1001", "1-1")),
    ("passes expired unrun", lambda s: _ticks(s, lambda t: t["expired"], ",")),
    ("tick result held in Redis (bytes)", lambda s: _ticks(s, lambda t: t["result_redis_bytes"], ",")),
    ("load average during the ticks", lambda s: " / ".join(t["load"] for t in s.get("reconcile", {}).get("ticks", []))),
    ("send side alone (part s): CPU (s)", lambda s: _each(s, "send", "cpu_s", ".2f")),
    ("send side alone (part s): wall (s)", lambda s: _each(s, "send", "wall_s", ".2f")),
    ("beat CPU per tick sent (ms)", _get("beat.cpu_ms_per_tick", ".1f")),
    ("Redis: agents' keys, memory", lambda s: f"{s['redis_agents']['keys']:,} keys, {_mb(s['redis_agents']['used_memory'])}"
     if "redis_agents" in s else "-"),
    ("Redis: after the ticks", lambda s: f"{s['redis_after_ticks']['keys']:,} keys, "
     f"{_mb(s['redis_after_ticks']['used_memory'])}" if "redis_after_ticks" in s else "-"),
    ("Redis: keys without a TTL", _no_ttl),
    ("Redis: residue of an hour's reconcile ticks", _hour),
    ("status --json: wall (s)", _get("status.wall_s", ".2f")),
    ("status --json: CPU (s)", _get("status.cpu_s", ".2f")),
    ("status --json: bytes, queues", lambda s: f"{s['status']['bytes']:,}, {s['status']['queues']:,}" if "status" in s else "-"),
    ("Flower /api/queues/length: wall (s), 1st / 2nd", lambda s: _pair(s, "queues_api", "wall_s", ".2f")),
    ("Flower /api/queues/length: bytes", _get("flower.queues_api_second.bytes", ",")),
    ("Flower Broker page: wall (s), 1st / 2nd", lambda s: _pair(s, "broker_page", "wall_s", ".2f")),
    ("Flower Broker page: bytes", _get("flower.broker_page_second.bytes", ",")),
    ("budget reads alone (part r): wall (s)", lambda s: _each(s, "budget_reads", "wall_s", ".2f")),
    ("budget reads alone (part r): CPU (s), client + server", lambda s: _each(s, "budget_reads", "cpu_s", ".2f")),
    ("budget reads alone (part r): client CPU (s): the fleet's", lambda s: _each(s, "budget_reads", "client_cpu_s", ".2f")),
    ("budget reads alone (part r): server CPU (s): loopback", lambda s: _each(s, "budget_reads", "server_cpu_s", ".2f")),
    ("budget reads alone (part r): calls, MB, peak RSS MB", lambda s: " / ".join(
        f"{r['calls']}, {r['bytes'] / 1e6:.1f}, {r['maxrss_mb']}" for r in (s.get("budget_reads") or {}).get("rounds", []))
     or "-"),
    ("budget: GPU pods", _get("budget.pods", ",")),
    ("budget tick reads: wall (s)", _get("budget.tick_s", ".2f")),
    ("budget tick reads: CPU (s, server included)", _get("budget.tick_cpu_s", ".2f")),
    ("budget tick reads: API calls", _get("budget.tick_calls", "")),
    ("budget tick reads: bytes", lambda s: _mb(s["budget"]["tick_bytes"]) if "budget" in s else "-"),
    ("scaling tick evaluations: wall (s)", _get("budget.first.wall_s", ".1f")),
    ("scaling tick evaluations: CPU (s)", _get("budget.first.cpu_s", ".1f")),
    ("scaling tick evaluations: calls per deployment", lambda s: f"{s['budget']['first']['calls'] / s['budget']['deployments']:.2f}"
     if "budget" in s else "-"),
    ("evaluation results kept per tick; a day of ticks", lambda s: f"{_mb(s['budget']['quiet']['result_bytes'])}; "
     f"{_mb(s['budget']['quiet']['result_bytes'] * 2880)}" if "budget" in s else "-"),
    ("quiet tick evaluations: wall (s), calls", lambda s: f"{s['budget']['quiet']['wall_s']:.1f}, "
     f"{s['budget']['quiet']['calls']}" if "budget" in s else "-"),
    ("load average (start, end)", lambda s: f"{s.get('load_start')} -> {s.get('load_end')}"),
]


def _each(s: dict[str, Any], part: str, field: str, fmt: str) -> str:
    got = s.get(part)
    rows = got.get("rounds", []) if isinstance(got, dict) else got or []
    return " / ".join(format(r[field], fmt) for r in rows) or "-"


def _pair(s: dict[str, Any], name: str, field: str, fmt: str) -> str:
    f = s.get("flower") or {}
    if f"{name}_first" not in f:
        return "-"
    return " / ".join(f"{f[k][field]:{fmt}}" + ("" if f[k]["status"] == 200 else f" ({f[k]['status']})")
                      for k in (f"{name}_first", f"{name}_second") if k in f)


def report(sizes: list[dict[str, Any]]) -> None:
    head = ["| nodes |" + "".join(f" {s['nodes']:,} |" for s in sizes), "|---|" + "---:|" * len(sizes)]
    lines = [f"| {label} |" + "".join(f" {fn(s)} |" for s in sizes) for label, fn in ROWS]
    print("\n".join(head + lines))
