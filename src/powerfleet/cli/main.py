"""The `powerfleet` command line."""

from __future__ import annotations

from typing import Optional

import typer

from powerfleet.cli import (agent_cmd, budget_cmd, demo_cmd, power_cmd, processes, retune_cmd, sim_cmd, status_cmd, taskapi,
                            twin_cmd, up, validate_cmd)
from powerfleet.cli.context import CliState

app = typer.Typer(
    help="powerfleet: a Celery worker fleet for GPU power budgets and KV-router retuning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, "--config", envvar="POWERFLEET_CONFIG",
                                         help="YAML config file (POWERFLEET_* variables override it)."),
) -> None:
    ctx.obj = CliState(config_path=config)


app.command()(processes.worker)
app.command()(processes.beat)
app.command()(processes.flower)
app.command()(up.up)
app.command()(demo_cmd.demo)
app.command()(twin_cmd.twin)
app.command()(taskapi.trigger)
app.command()(status_cmd.status)
app.add_typer(agent_cmd.app, name="agent")
app.add_typer(sim_cmd.app, name="sim")
app.add_typer(retune_cmd.app, name="retune")
app.add_typer(validate_cmd.app, name="validate")
app.add_typer(budget_cmd.app, name="budget")
app.add_typer(power_cmd.app, name="power")


def main() -> None:
    """Run the CLI; a usage error (missing or out-of-range option) is one line, like every other error.

    Typer draws usage errors as a multi-line box; here they become
    ``powerfleet <command>: error: <what was wrong>`` with click's exit code (2).
    """
    import sys

    ex = _click_exceptions()
    try:
        code = app(standalone_mode=False)
    except ex.NoArgsIsHelpError as exc:
        exc.show()  # a bare group: its help is the answer
        sys.exit(exc.exit_code)
    except _usage_errors(ex) as exc:
        # Celery's own CLI (run inside `worker`, `agent`, `beat`, `flower`) raises click's
        # errors, not typer's vendored ones: e.g. `agent --loglevel BOGUS`.
        ours = isinstance(exc, ex.ClickException) and getattr(exc, "ctx", None) is not None
        where = exc.ctx.command_path if ours else "powerfleet"
        message = " ".join(exc.format_message().split())
        typer.echo(f"{where}: error: {message}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("powerfleet: aborted", err=True)
        sys.exit(1)
    # The last line of defence for two families no option type catches everywhere: input nested
    # deeper than Python's parsers recurse, and a number too large for what it feeds (a float
    # of 1e308 seconds given to a socket timeout). Each stays one line.
    except RecursionError:
        typer.echo("powerfleet: error: input nested too deeply to parse", err=True)
        sys.exit(2)
    except OverflowError as exc:
        typer.echo(f"powerfleet: error: a number is out of range ({' '.join(str(exc).split())})", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_errors(ex) -> tuple[type[BaseException], ...]:  # type: ignore[no-untyped-def]
    import click

    return tuple({ex.ClickException, click.ClickException})


def _click_exceptions():  # type: ignore[no-untyped-def]
    try:  # newer typer vendors click as typer._click
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions
