"""`powerfleet budget ...` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from powerfleet.cli.errors import EXIT_USAGE, fail, read_text_input

app = typer.Typer(help="Power and GPU budgets: plan replica targets.", no_args_is_help=True)


def _text_line(ans: dict[str, Any]) -> str:
    if "error" in ans:
        return f"error: {ans['error']}"
    targets = " ".join(f"{r}={'-' if t is None else t}" for r, t in ans["targets"].items())
    reasons = ",".join(ans["reasons"]) or "-"
    return f"{targets} settled_w={ans['settled_w']} peak_w={ans['peak_w']} gpus={ans['gpus']} peak_gpus={ans['peak_gpus']} reasons={reasons}"


@app.command("plan")
def plan_cmd(
    input_file: Annotated[Path, typer.Option("--input", help="JSON object, or JSON lines (one input each); '-' for stdin")],
    json_out: Annotated[bool, typer.Option("--json", help="answer with JSON lines (docs/budget.md)")] = False,
) -> None:
    """Plan replica targets for one or more inputs; one answer line per input.

    A null target (shown '-') means "leave as is". An input that cannot be planned answers an
    error on its line, and the command exits 2 after answering every line.
    """
    from powerfleet.budget.io import answer, split_inputs

    text = read_text_input(input_file, "--input")
    inputs = split_inputs(text)
    if not inputs:
        fail(f"{input_file} holds no input")
    failed: list[tuple[int, str]] = []
    for i, raw in enumerate(inputs, 1):
        ans = answer(raw)
        if "error" in ans:
            failed.append((i, " ".join(str(ans["error"]).split())))
        if json_out:  # one answer line per input on stdout (the contract), errors included
            typer.echo(json.dumps(ans, sort_keys=True))
        elif "error" not in ans:
            typer.echo(_text_line(ans))
    if failed:  # one line on stderr: the first error, and how many more (--json answers each)
        first, why = failed[0]
        more = f" (and {len(failed) - 1} more of {len(inputs)} inputs; --json answers each)" if len(failed) > 1 else ""
        typer.echo(f"powerfleet: error: input {first}: {why}{more}", err=True)
        raise typer.Exit(EXIT_USAGE)
