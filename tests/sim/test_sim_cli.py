"""`powerfleet sim replay` and `powerfleet retune sweep` through the console script."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import TINY

EXE = Path(sys.executable).parent / "powerfleet"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    if not EXE.exists():
        pytest.skip("powerfleet console script not installed next to the interpreter")
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120)


REPLAY_KEYS = {
    "schema", "requests", "completed", "dropped", "duration_s", "throughput_tok_s", "ttft_ms", "itl_ms",
    "e2e_ms", "cache_hit_rate", "goodput_req_s", "throughput_per_gpu_tok_s", "throughput_per_user_tok_s",
    "load_imbalance", "dropped_reasons", "window_s",
}


def test_replay_json_is_documented_shape_and_byte_identical() -> None:
    args = ("sim", "replay", "--trace", str(TINY), "--workers", "3", "--seed", "7", "--json",
            "--policy", '{"temperature": 0.5}', "--sla", '{"ttft_ms": 3000, "itl_ms": 100}')
    a, b = run(*args), run(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    d = json.loads(a.stdout)
    assert REPLAY_KEYS <= set(d)
    assert d["schema"] == "powerfleet.sim.replay/v1"
    assert set(d["ttft_ms"]) >= {"mean", "p50", "p90", "p99"}
    assert d["requests"] == 60 and d["completed"] + d["dropped"] == 60
    assert 0 <= d["cache_hit_rate"] <= 1 and d["goodput_req_s"] is not None
    assert d["policy"]["temperature"] == 0.5 and d["policy"]["overlap_score_credit"] == 1.0


def test_replay_window_speedup_and_no_sla() -> None:
    r = run("sim", "replay", "--trace", str(TINY), "--workers", "2", "--window", "5:15", "--speedup", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert 0 < d["requests"] < 60 and d["goodput_req_s"] is None and d["window_s"] == 5.0
    human = run("sim", "replay", "--trace", str(TINY), "--workers", "2")
    assert human.returncode == 0 and "TTFT" in human.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--trace", "/nonexistent/t.jsonl", "--workers", "2"), "does not exist"),
        (("--trace", str(TINY), "--workers", "2", "--policy", "{bad"), "policy is not valid JSON"),
        (("--trace", str(TINY), "--workers", "2", "--policy", '{"overlap_score_credit": -1}'), "overlap_score_credit"),
        (("--trace", str(TINY), "--workers", "2", "--sla", '{"itl_ms": 5}'), "--sla"),
        (("--trace", str(TINY), "--workers", "100000"), "--workers must be <= 4096"),
        (("--trace", str(TINY), "--workers", "2", "--router", '{"router_queue_policy": "x"}'), "--router"),
        (("--trace", str(TINY), "--workers", "2", "--warmup-s", "-3"), "--warmup-s"),
        (("--trace", str(TINY), "--workers", "2", "--window", "abc"), "window"),
        (("--trace", str(TINY), "--workers", "0"), "--workers must be >= 1"),
        (("--trace", str(TINY), "--workers", "2", "--engine", '{"max_num_seqs": 0}'), "engine max_num_seqs"),
        (("--trace", str(TINY), "--workers", "2", "--cap-fraction", "2"), "cap fraction"),
    ],
)
def test_replay_bad_input_is_one_line_exit_2(args, needle) -> None:
    r = run("sim", "replay", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("powerfleet: error: ") and needle in lines[0]
    assert "Traceback" not in r.stderr


def test_malformed_line_warns_and_strict_fails(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl.gz"
    text = TINY.read_text().splitlines()
    text.insert(3, '{"timestamp": 1, "input_length": "x"}')
    p.write_bytes(gzip.compress(("\n".join(text) + "\n").encode()))
    r = run("sim", "replay", "--trace", str(p), "--workers", "2", "--json")
    assert r.returncode == 0 and "trace line 4: input_length" in r.stderr
    assert json.loads(r.stdout)["requests"] == 60
    r = run("sim", "replay", "--trace", str(p), "--workers", "2", "--strict")
    assert r.returncode == 2 and "trace line 4" in r.stderr


def test_sweep_json_probe_matches_replay_and_errors(tmp_path: Path) -> None:
    grid = tmp_path / "g.json"
    grid.write_text(json.dumps({"overlap_score_credit": {"choices": [0, 1]}, "prefill_load_scale": {"choices": [1, 4]}}))
    cur = '{"overlap_score_credit": 0.5}'
    r = run("retune", "sweep", "--trace", str(TINY), "--workers", "3", "--objective", "ttft", "--current", cur,
            "--grid", str(grid), "--shards", "2", "--seed", "3", "--window", "0:20", "--json", "--no-search")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema"] == "powerfleet.retune.sweep/v1"
    assert len(d["candidates"]) == 4 and all({"params", "score", "ok", "reason"} <= set(c) for c in d["candidates"])
    assert set(d["decision"]) >= {"action", "params", "improvement_pct", "reason"}
    assert d["decision"]["action"] in ("apply", "keep")
    rep = run("sim", "replay", "--trace", str(TINY), "--workers", "3", "--policy", cur, "--seed", "3",
              "--window", "0:20", "--json")
    assert d["probe"]["score"] == json.loads(rep.stdout)["ttft_ms"]["mean"]
    g = run("retune", "sweep", "--trace", str(TINY), "--workers", "3", "--objective", "goodput", "--current", "{}",
            "--grid", str(grid), "--json")
    assert g.returncode == 2 and g.stderr.strip() == (
        "powerfleet: error: --objective goodput needs --sla (ttft_ms and itl_ms, or e2e_ms)")
    bad = run("retune", "sweep", "--trace", str(TINY), "--workers", "3", "--objective", "speed", "--current", "{}")
    assert bad.returncode == 2 and bad.stderr.startswith("powerfleet: error: --objective: unknown objective")
    bad = run("retune", "sweep", "--trace", str(TINY), "--workers", "3", "--objective", "ttft", "--current", "[]")
    assert bad.returncode == 2 and "--current must be a JSON object" in bad.stderr
    bad = run("retune", "sweep", "--trace", str(TINY), "--workers", "3", "--objective", "ttft",
              "--current", '{"temperature": -1}')
    assert bad.returncode == 2 and bad.stderr.startswith("powerfleet: error: --current temperature")


def test_help_exists() -> None:
    for cmd in (("sim", "replay"), ("retune", "sweep")):
        r = run(*cmd, "--help")
        assert r.returncode == 0 and "--json" in r.stdout


def _hostile_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "binary": bytes(range(256)) * 8,
        "latin1": "timestamp: caf\xe9\n".encode("latin-1"),
        "utf16": '{"timestamp": 1}'.encode("utf-16"),
        "fake-gzip": b"\x1f\x8b\x08not really gzip",
        "empty": b"",
        "yaml-broken": b"overlap_score_credit: [unclosed\n  - {",
        "yaml-list": b"- 1\n- 2\n",
        "yaml-tag": b"overlap_score_credit: !!python/object/apply:os.system ['true']\n",
        "json-nan": b'{"temperature": {"choices": [NaN]}}',
    }
    out = {}
    for name, data in files.items():
        suffix = ".yaml" if name.startswith("yaml") else ".json" if name.startswith("json") else ".jsonl"
        p = tmp_path / (name + suffix)
        p.write_bytes(data)
        out[name] = p
    out["directory"] = tmp_path
    return out


def test_hostile_files_are_one_line_exit_2_never_a_traceback(tmp_path: Path) -> None:
    files = _hostile_files(tmp_path)
    for name, path in files.items():
        cases = [("sim", "replay", "--trace", str(path), "--workers", "2"),
                 ("retune", "sweep", "--trace", str(TINY), "--workers", "2", "--objective", "ttft",
                  "--current", "{}", "--grid", str(path)),
                 ("sim", "replay", "--trace", str(TINY), "--workers", "2", "--profile", str(path))]
        for args in cases:
            r = run(*args)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2, (name, args, r.stderr)
            assert "Traceback" not in r.stderr and len(lines) == 1, (name, args, r.stderr)
            assert lines[0].startswith("powerfleet: error: "), (name, args, r.stderr)


def test_sweep_refuses_more_processes_than_cpus_and_an_empty_window() -> None:
    many = run("retune", "sweep", "--trace", str(TINY), "--workers", "2", "--objective", "ttft", "--current", "{}",
               "--processes", str((os.cpu_count() or 1) + 1))
    assert many.returncode == 2 and "--processes must be at most" in many.stderr and many.stderr.count("\n") == 1
    empty = run("retune", "sweep", "--trace", str(TINY), "--workers", "2", "--objective", "ttft", "--current", "{}",
                "--window", "99999:")
    assert empty.returncode == 2 and "no request of the trace" in empty.stderr
