"""Mutation check: plant realistic bugs in the safety-critical code, one at a time, and see
whether the tests catch each of them.

    .venv/bin/python bench/mutants.py [--list] [--only NAME ...] [--json] [--timeout S]
                                      [--no-baseline] [--keep]      (or: make mutants)

Each mutant (bench/mutant_list.py) is a file under src/, one exact snippet of it, its
replacement, and the test files that should catch it. The working tree is never changed:
src/ and tests/ are copied once into a temporary directory (everything else is linked), each
mutant is written into the copy, ``pytest -x`` runs the mutant's test files there with the
copy first on PYTHONPATH (spawned workers inherit it), and the copy's file is put back before
the next mutant, whatever happened (a failure, a timeout, Ctrl-C). The copy is removed at the
end unless --keep.

A mutant is *killed* when its tests fail (or cannot even be collected), *survived* when they
all passed, *timeout* when they ran past --timeout: not counted as caught (a test that hangs
on a mutant fails on its own, through pytest-timeout's per-test limit; a whole run past the
limit means a slow machine, so rerun it with a larger --timeout). A snippet
that is not in its file exactly once, or a mutant that does not compile, stops the run before
anything runs. Before the mutants, a baseline run of every selected test file on the
unmutated copy must pass, so that a kill means the mutant, not a test that fails anyway.

Exit status: 0 every mutant killed, 1 some survived or timed out, 2 the check itself could not run.
Not part of `make test`; docs/benchmarks.md records the score.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.mutant_list import MUTANTS, Mutant  # noqa: E402

COPIED = ("src", "tests")  # everything else at the top of the tree is linked, read-only by convention
NOT_LINKED = {".git", ".pytest_cache", ".hypothesis", "__pycache__", *COPIED}
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache", "*.egg-info")


class CheckError(Exception):
    """The mutation check cannot run as asked (a snippet not found, a missing test file, a red baseline)."""


@dataclass
class Outcome:
    name: str
    file: str
    bug: str
    tests: list[str]
    status: str  # killed | timeout | survived | error
    seconds: float
    caught_by: str | None = None  # the first failing test, as pytest names it
    note: str = ""

    @property
    def caught(self) -> bool:
        return self.status == "killed"


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    baseline_s: float | None = None
    interrupted: bool = False

    def summary(self) -> dict[str, Any]:
        caught = sum(o.caught for o in self.outcomes)
        total = len(self.outcomes)
        return {"caught": caught, "total": total,
                "score_percent": round(100.0 * caught / total, 1) if total else None,
                "survivors": [o.name for o in self.outcomes if o.status == "survived"],
                "timeouts": [o.name for o in self.outcomes if o.status == "timeout"],
                "errors": [o.name for o in self.outcomes if o.status == "error"],
                "baseline_s": self.baseline_s, "interrupted": self.interrupted,
                "mutants": [asdict(o) for o in self.outcomes]}


# -- choosing and checking mutants --

def select(names: list[str] | None) -> list[Mutant]:
    """The mutants named (exact names or shell patterns such as ``budget.*``), in list order."""
    if not names:
        return list(MUTANTS)
    unknown = [n for n in names if not any(fnmatch.fnmatchcase(m.name, n) for m in MUTANTS)]
    if unknown:
        raise CheckError(f"--only: no mutant matches {', '.join(unknown)} (see --list)")
    return [m for m in MUTANTS if any(fnmatch.fnmatchcase(m.name, n) for n in names)]


def mutated_text(m: Mutant, original: str) -> str:
    """The file with the mutant planted; CheckError unless the snippet occurs exactly once."""
    n = original.count(m.original)
    if n != 1:
        raise CheckError(f"{m.name}: the snippet to replace occurs {n} times in {m.file} (must be exactly once); "
                         "the code moved on: update bench/mutant_list.py")
    text = original.replace(m.original, m.replacement)
    if text == original:
        raise CheckError(f"{m.name}: the replacement changes nothing")
    try:
        compile(text, m.file, "exec")
    except SyntaxError as exc:
        raise CheckError(f"{m.name}: the mutated {m.file} does not compile ({exc.msg}, line {exc.lineno})") from None
    return text


def check_all(mutants: list[Mutant]) -> None:
    """Every selected mutant applies cleanly and every test file it names exists, before anything runs."""
    problems = []
    for m in mutants:
        path = ROOT / m.file
        if not m.file.startswith("src/") or not path.is_file():
            problems.append(f"{m.name}: {m.file} is not a file under src/")
            continue
        try:
            mutated_text(m, path.read_text(encoding="utf-8"))
        except CheckError as exc:
            problems.append(str(exc))
        problems += [f"{m.name}: test file {t} does not exist" for t in m.tests
                     if not (ROOT / t.split("::")[0]).is_file()]
    if problems:
        raise CheckError("; ".join(problems))


# -- the copy of the tree --

def make_copy(base: Path) -> Path:
    """src/ and tests/ copied, every other top-level entry linked; returns the copy's root."""
    tree = base / ROOT.name
    tree.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in COPIED:
            shutil.copytree(entry, tree / entry.name, ignore=IGNORE, symlinks=True)
        elif entry.name not in NOT_LINKED and not entry.name.endswith(".egg-info"):
            (tree / entry.name).symlink_to(entry.resolve())
    shared = ROOT.parent / "shared"  # traces beside the checkout, where the twin looks for them
    if shared.exists() and not (base / "shared").exists():
        (base / "shared").symlink_to(shared.resolve())
    return tree


def child_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), *filter(None, [env.get("PYTHONPATH")])])
    # No bytecode in the copy: a restored file must never be served from a mutant's stale .pyc.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_copy_is_imported(tree: Path) -> None:
    out = subprocess.run([sys.executable, "-c", "import powerfleet; print(powerfleet.__file__)"], cwd=tree,
                         env=child_env(tree), capture_output=True, text=True, timeout=60)
    where = Path(out.stdout.strip() or "?").resolve()
    if out.returncode != 0 or not where.is_relative_to((tree / "src").resolve()):
        raise CheckError(f"the copy's powerfleet is not the one imported ({where}; {out.stderr.strip()[-200:]}): "
                         "mutants would run against the working tree")


# -- running pytest --

# pytest's short summary ("FAILED tests/x.py::test[Bad Node] - ..."), not a captured log's "ERROR    name:..."
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S[^\n]*?\.py\b[^\n]*?)(?: - [^\n]*)?$", re.M)
# Where the first failure was raised ("tests/x.py:45: AssertionError"), not a frame on the way ("...: in f").
WHERE = re.compile(r"^(\S+\.py:\d+): (?!in )\w+", re.M)


def run_pytest(tree: Path, tests: list[str], timeout_s: float) -> tuple[str, float, str | None, str]:
    """(status, seconds, first failing test, output tail). The child runs in its own session so
    that a timeout or Ctrl-C ends it and every worker it spawned."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=child_env(tree), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _end(proc)
        return "timeout", time.monotonic() - t0, None, ""
    except BaseException:
        _end(proc)
        raise
    seconds = time.monotonic() - t0
    first = FAILED.search(out)
    tail = "\n".join(out.strip().splitlines()[-5:])
    if proc.returncode == 0:
        return "passed", seconds, None, tail
    if proc.returncode in (1, 2):  # tests failed, or collection broke (an import the mutant broke)
        where = WHERE.search(out)
        caught_by = (first.group(1) if first else "(collection)") + (f" ({where.group(1)})" if where else "")
        return "failed", seconds, caught_by, tail
    return "error", seconds, None, tail  # usage error, internal error, nothing collected


def _end(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # our child's own session: it and what it spawned
    except ProcessLookupError:
        pass
    proc.communicate()


def run_mutant(tree: Path, m: Mutant, timeout_s: float) -> Outcome:
    target = tree / m.file
    original = (ROOT / m.file).read_text(encoding="utf-8")  # the working tree's file: never written
    # A fresh hypothesis database per mutant: an example stored under an earlier mutant (or one a
    # flaky oracle tripped on) must not be replayed as this mutant's kill.
    shutil.rmtree(tree / ".hypothesis", ignore_errors=True)
    target.write_text(mutated_text(m, original), encoding="utf-8")
    try:
        status, seconds, first, tail = run_pytest(tree, list(m.tests), timeout_s)
    finally:
        target.write_text(original, encoding="utf-8")
    base = dict(name=m.name, file=m.file, bug=m.bug, tests=list(m.tests), seconds=round(seconds, 1))
    if status == "failed":
        return Outcome(**base, status="killed", caught_by=first)
    if status == "timeout":
        return Outcome(**base, status="timeout", note=f"tests ran past {timeout_s:.0f} s")
    if status == "passed":
        return Outcome(**base, status="survived")
    return Outcome(**base, status="error", note=tail)


# -- the command --

def print_list(mutants: list[Mutant], as_json: bool) -> None:
    if as_json:
        print(json.dumps([asdict(m) for m in mutants], indent=2))
        return
    for m in mutants:
        print(f"{m.name}\n    {m.file}: {m.bug}\n    tests: {' '.join(m.tests)}")


NAME_WIDTH = max(len(m.name) for m in MUTANTS)


def line(o: Outcome) -> str:
    shown = {"killed": "killed", "timeout": "timeout", "survived": "SURVIVED", "error": "ERROR"}[o.status]
    notes = o.note.splitlines()
    detail = o.caught_by or (notes[-1] if notes else "")
    return f"  {shown:9s} {o.name:{NAME_WIDTH}s} {o.seconds:6.1f} s  {detail}"


def run(args: argparse.Namespace) -> int:
    mutants = select(args.only)
    if args.list:
        print_list(mutants, args.json)
        return 0
    check_all(mutants)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    report = Report()
    base = Path(tempfile.mkdtemp(prefix="powerfleet-mutants-"))
    try:
        tree = make_copy(base)
        check_copy_is_imported(tree)
        say(f"{len(mutants)} mutants, each planted in a copy of the tree ({tree}); pytest -x, "
            f"timeout {args.timeout:.0f} s each")
        if not args.no_baseline:
            files = sorted({t for m in mutants for t in m.tests})
            status, seconds, first, tail = run_pytest(tree, files, args.baseline_timeout)
            report.baseline_s = round(seconds, 1)
            if status != "passed":
                raise CheckError(f"baseline: the tests fail on the unmutated tree ({status}"
                                 f"{', ' + first if first else ''}); fix that first:\n{tail}")
            say(f"baseline: {len(files)} test file{'s' if len(files) != 1 else ''} pass unmutated ({seconds:.1f} s)")
        for m in mutants:
            outcome = run_mutant(tree, m, args.timeout)
            report.outcomes.append(outcome)
            say(line(outcome))
    except KeyboardInterrupt:
        report.interrupted = True
        say("interrupted: the copy is discarded; the working tree was never changed")
    finally:
        if args.keep:
            say(f"kept the copy at {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    summary = report.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"score: {summary['caught']}/{summary['total']} caught"
              + (f" ({summary['score_percent']} %)" if summary["total"] else "")
              + (" (interrupted: partial)" if report.interrupted else ""))
        survivors = [o for o in report.outcomes if o.status == "survived"]
        if survivors:
            print("survivors (a test that fails on each is missing):")
            for o in survivors:
                print(f"  {o.name}  {o.file}: {o.bug}")
        for o in report.outcomes:
            if o.status == "timeout":
                print(f"  timeout {o.name}: {o.note}; not counted as caught (rerun with a larger --timeout)")
            if o.status == "error":
                print(f"  error {o.name}: {o.note}")
    if report.interrupted:
        return 130
    if summary["errors"]:
        return 2
    return 1 if summary["survivors"] or summary["timeouts"] else 0


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the run the way Ctrl-C does: child ended, copy removed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="list the mutants (name, file, bug, tests) and exit")
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help="run only these mutants (names or shell patterns, e.g. 'planner.*' 's?.*')")
    p.add_argument("--json", action="store_true", help="print the result (or the list) as JSON on stdout")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's test run (default 300)")
    p.add_argument("--baseline-timeout", type=float, default=900.0, help="seconds for the baseline run (default 900)")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated baseline run")
    p.add_argument("--keep", action="store_true", help="keep the temporary copy of the tree")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return run(args)
    except CheckError as exc:
        print(f"mutants: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
