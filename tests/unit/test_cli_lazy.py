"""The CLI imports a command's module only when that command runs: `--help` lists every command
without importing any (the twin's numpy, the Kubernetes client and the tasks cost every command)."""

from __future__ import annotations

import json
import subprocess
import sys

import typer
from typer.testing import CliRunner

from powerfleet.cli.main import COMMANDS, app, load_command


def test_the_root_help_lists_each_command_with_its_own_first_line() -> None:
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    for name, (_, _, line) in COMMANDS.items():
        real = load_command(name)
        first = " ".join((real.short_help or real.help or "").split("\n\n")[0].split())
        assert line == first, (name, line, first)  # the stand-in's line cannot drift from the command's
        assert f" {name} " in out.output and line[:60] in " ".join(out.output.split()), name


def test_every_command_is_reachable_and_only_those() -> None:
    root = typer.main.get_command(app)
    assert list(root.list_commands(None)) == list(COMMANDS)  # type: ignore[arg-type]
    for name in COMMANDS:
        out = CliRunner().invoke(app, [name, "--help"])
        assert out.exit_code == 0, (name, out.output[:300])
        assert f" {name} [OPTIONS]" in out.output, (name, out.output[:300])


PROBE = """
import json, sys
from powerfleet.cli.main import app, COMMANDS
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
mods = {m for m, _, _ in COMMANDS.values()}
print(json.dumps({"commands": sorted(m for m in mods if m in sys.modules),
                  "heavy": sorted(m for m in ("numpy", "kubernetes", "celery", "powerfleet.twin", "powerfleet.tasks")
                                  if m in sys.modules)}))
"""


def _imported(*argv: str) -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_imports_no_command_and_a_command_only_its_own() -> None:
    assert _imported("--help") == {"commands": [], "heavy": []}
    status = _imported("status", "--help")
    assert status["commands"] == ["powerfleet.cli.status_cmd"] and "numpy" not in status["heavy"], status
