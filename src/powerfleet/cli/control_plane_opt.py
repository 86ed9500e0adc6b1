"""``--control-plane loopback|real`` of ``powerfleet twin`` and ``powerfleet demo`` (docs/twin.md, "The twin
on the real control plane"): the twin's API server is the loopback one (the default: no Go needed),
or etcd + kube-apiserver built by ``make control-plane``, refused in one line where they are not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from powerfleet.cli.errors import fail

CHOICES = ("loopback", "real")
HELP = ("The twin's API server: loopback (in process) or real (etcd + kube-apiserver v1.37.2 from "
        "`make control-plane`, Dynamo's CRDs installed).")


def option() -> Any:
    return typer.Option("loopback", "--control-plane", help=HELP)


def resolve(choice: str) -> Callable[[Path], Any | None]:
    """Checked before anything starts: the twin's server for a root directory (None: the loopback
    one), else the real one's ``RealApiServer`` (not started yet); exit 2 in one line where the
    choice is unknown or the control plane is not built."""
    if choice not in CHOICES:
        fail(f"--control-plane: {choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "loopback":
        return lambda _root: None
    from powerfleet.testing.controlplane import built_bin_dir
    from powerfleet.testing.controlplane.twin_api import RealApiServer

    bin_dir = built_bin_dir()
    if bin_dir is None:
        fail("--control-plane real: the control plane is not built (run `make control-plane`; it needs Go)")
    return lambda root: RealApiServer(bin_dir, root / "control-plane")
