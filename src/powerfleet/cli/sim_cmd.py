"""`powerfleet sim ...` commands."""

import typer

app = typer.Typer(help="sim commands", no_args_is_help=True)
