"""Fuzz every parser of outside input for longer than the test suite does.

    .venv/bin/python bench/fuzz.py [--examples N] [--atheris-runs N] [--only NAME ...]

Each target (src/powerfleet/testing/fuzz_targets.py) must answer or raise its own documented error. Phase 1
runs hypothesis with N examples per target (default 3,000). Phase 2, where atheris imports
(`pip install atheris`), runs coverage-guided fuzzing from the same seeds for --atheris-runs
inputs per target, each in a child process (atheris owns the process it runs in). Prints one
line per target per phase: inputs tried, wall seconds, and the first failure if any; exits 1
if any target failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from powerfleet.testing.fuzz_targets import SEEDS, TARGETS

ROOT = Path(__file__).resolve().parents[1]


def run_hypothesis(name: str, examples: int) -> tuple[int, str | None]:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    seeds = SEEDS[name]
    inputs = (st.binary(max_size=2000) | st.sampled_from(seeds)
              | st.tuples(st.sampled_from(seeds), st.binary(max_size=64), st.integers(0, 400))
              .map(lambda t: t[0][: t[2]] + t[1] + t[0][t[2]:]))
    count = 0

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=inputs)
    def run(data: bytes) -> None:
        nonlocal count
        count += 1
        TARGETS[name](data)

    try:
        run()
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the other targets still run
        return count, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return count, None


ATHERIS_CHILD = """
import sys, atheris
with atheris.instrument_imports():
    import powerfleet.cluster.power, powerfleet.agent.cgroup, powerfleet.sim.trace, powerfleet.agent.state
    import powerfleet.retune.state, powerfleet.cluster.dgd, powerfleet.cluster.manifests, powerfleet.config.fleet
from powerfleet.testing.fuzz_targets import TARGETS
atheris.Setup(sys.argv, TARGETS[{name!r}])
atheris.Fuzz()
"""


def run_atheris(name: str, runs: int, workdir: Path) -> tuple[int, str | None]:
    corpus = workdir / name
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(SEEDS[name]):
        (corpus / f"seed{i}").write_bytes(seed)
    script = workdir / f"fuzz_{name}.py"
    script.write_text(ATHERIS_CHILD.format(name=name))
    out = subprocess.run([sys.executable, str(script), f"-runs={runs}", "-max_len=4096",
                          f"-artifact_prefix={workdir}/crash-{name}-", str(corpus)],
                         capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if out.returncode != 0:
        lines = [ln for ln in (out.stderr + out.stdout).splitlines() if "Error" in ln or "Exception" in ln]
        return runs, (lines[-1][:200] if lines else f"exit {out.returncode}")
    return runs, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=3000, help="hypothesis examples per target")
    ap.add_argument("--atheris-runs", type=int, default=20000, help="atheris inputs per target (0: skip)")
    ap.add_argument("--only", nargs="*", choices=sorted(TARGETS), help="just these targets")
    args = ap.parse_args()
    names = args.only or sorted(TARGETS)
    failed = False
    print(f"phase 1: hypothesis, {args.examples} examples per target")
    for name in names:
        t0 = time.perf_counter()
        n, err = run_hypothesis(name, args.examples)
        failed |= err is not None
        print(f"  {name:13s} {n:7d} inputs {time.perf_counter() - t0:7.1f} s  {'FAIL ' + err if err else 'ok'}",
              flush=True)
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("phase 2: atheris not installed (pip install atheris); skipped")
        return 1 if failed else 0
    if args.atheris_runs:
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="powerfleet-fuzz-"))
        print(f"phase 2: atheris, {args.atheris_runs} inputs per target (corpus and crashes under {work})")
        for name in names:
            t0 = time.perf_counter()
            n, err = run_atheris(name, args.atheris_runs, work)
            failed |= err is not None
            print(f"  {name:13s} {n:7d} inputs {time.perf_counter() - t0:7.1f} s  {'FAIL ' + err if err else 'ok'}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
