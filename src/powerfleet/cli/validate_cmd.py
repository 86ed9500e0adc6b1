"""`powerfleet validate ...` commands."""

import typer

app = typer.Typer(help="validate commands", no_args_is_help=True)
