"""`powerfleet retune ...` commands."""

import typer

app = typer.Typer(help="retune commands", no_args_is_help=True)
