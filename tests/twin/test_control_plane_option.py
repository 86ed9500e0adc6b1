"""``--control-plane`` of ``twin`` and ``demo`` where the real control plane is not built: one line,
exit 2, nothing started (the real runs are in tests/control_plane/test_twin_real.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("command", [["twin", "--duration", "1"], ["demo", "--duration", "30"]])
@pytest.mark.parametrize("choice, expected", [
    ("real", "powerfleet: error: --control-plane real: the control plane is not built "
             "(run `make control-plane`; it needs Go)"),
    ("etcd", "powerfleet: error: --control-plane: 'etcd' is not one of loopback, real"),
])
def test_an_unbuilt_or_unknown_control_plane_is_refused_in_one_line(tmp_path: Path, command: list[str],
                                                                     choice: str, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POWERFLEET_")}
    env["PF_CONTROL_PLANE_BIN"] = str(tmp_path)  # an empty directory: no binaries
    extra = ["--report", str(tmp_path / "report")] if command[0] == "demo" else ["--dir", str(tmp_path / "twin")]
    out = subprocess.run([sys.executable, "-m", "powerfleet.cli", *command, *extra, "--control-plane", choice],
                         env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (out.returncode, out.stderr.strip().splitlines()) == (2, [expected]), (out.returncode, out.stderr)
    assert not (tmp_path / "twin").exists() and not (tmp_path / "report").exists(), "started before the refusal"
