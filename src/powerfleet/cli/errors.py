"""How the CLI reports bad input: one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

EXIT_USAGE = 2  # bad config, bad arguments, unreadable input
EXIT_FAILURE = 1  # the command ran and found a problem (e.g. a validation violation)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    typer.echo(f"powerfleet: error: {message}", err=True)
    raise typer.Exit(code)


def print_json(data: object) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
