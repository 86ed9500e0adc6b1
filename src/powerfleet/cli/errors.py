"""How the CLI reports bad input: one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import typer

EXIT_USAGE = 2  # bad config, bad arguments, unreadable input
EXIT_FAILURE = 1  # the command ran and found a problem (e.g. a validation violation)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    typer.echo(f"powerfleet: error: {message}", err=True)
    raise typer.Exit(code)


def read_text_input(path: str | os.PathLike[str], option: str) -> str:
    """The UTF-8 text of a file a command was given, or of stdin for ``-``; any problem is exit 2.

    Bounded (powerfleet.textinput.MAX_INPUT_BYTES): ``/dev/zero`` is refused, not read forever.
    """
    from powerfleet.textinput import InputError, read_text

    try:
        return read_text(path)
    except InputError as exc:
        fail(f"{option}: {exc}")


def print_json(data: object) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
