"""The `powerfleet` command line."""

from __future__ import annotations

import typer

from powerfleet.cli import retune_cmd, sim_cmd, validate_cmd
from powerfleet.cli.errors import CliError

app = typer.Typer(
    help="powerfleet: a Celery worker fleet for GPU power budgets and KV-router retuning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(sim_cmd.app, name="sim")
app.add_typer(retune_cmd.app, name="retune")
app.add_typer(validate_cmd.app, name="validate")


def main() -> None:
    try:
        app()
    except CliError as exc:
        typer.echo(f"powerfleet: error: {exc}", err=True)
        raise SystemExit(exc.code) from None
