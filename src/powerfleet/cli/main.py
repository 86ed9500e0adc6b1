"""The `powerfleet` command line.

Each command's module is imported only when that command runs (or its own help is shown):
importing them all (numpy through the twin, the Kubernetes client, Celery's tasks) cost every
command, `--help` included, about 0.4 s. ``COMMANDS`` names each command, the module and
attribute that define it, and the one-line help the root `--help` lists without importing it
(tests/unit/test_cli_lazy.py keeps that line equal to the command's own).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any, Optional

import typer
from typer.core import TyperGroup

# name -> (module, attribute: a command function or a sub-Typer, the line the root help lists)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "worker": ("powerfleet.cli.processes", "worker",
               "Run a worker consuming the given queues (control, sweep, node.<name>)."),
    "beat": ("powerfleet.cli.processes", "beat",
             "Run beat. A Redis lock (RedBeat) keeps a second beat on standby until the first stops."),
    "flower": ("powerfleet.cli.processes", "flower",
               "Run Flower. Off loopback it refuses to start without basic-auth credentials."),
    "up": ("powerfleet.cli.up", "up",
           "Embedded Redis (unless broker.url is set) + beat + a control/sweep worker + node agents + Flower."),
    "demo": ("powerfleet.cli.demo_cmd", "demo",
             "The main job on embedded defaults: the fleet keeps a twin GPU cluster in budget and its routers tuned."),
    "twin": ("powerfleet.cli.twin_cmd", "twin",
             "Run the twin: a loopback Kubernetes API with GPU nodes, two DGDs, their pods, GPUs, frontends and "
             "traffic."),
    "trigger": ("powerfleet.cli.taskapi", "trigger", "Send any powerfleet task by name and print its JSON result."),
    "status": ("powerfleet.cli.status_cmd", "status",
               "Workers and their queues, queue depths, ticks, and the broker's master, replicas and last failover."),
    "agent": ("powerfleet.cli.agent_cmd", "app",
              "The GPU node agent: `agent --node N` runs it; `agent once` does one pass."),
    "sim": ("powerfleet.cli.sim_cmd", "app", "Trace-replay simulator of KV-routed LLM workers."),
    "retune": ("powerfleet.cli.retune_cmd", "app", "KV-router retune: sweeps and decisions."),
    "validate": ("powerfleet.cli.validate_cmd", "app",
                 "Offline checks of inputs before they reach a cluster: `dgd-update` checks that a DGD update leaves "
                 "every power-annotated component's power inputs unchanged."),
    "budget": ("powerfleet.cli.budget_cmd", "app", "Power and GPU budgets: plan replica targets."),
    "power": ("powerfleet.cli.power_cmd", "app",
              "Measured-power oversubscription: the live guard's process, and the guard on replayed traffic."),
}


def load_command(name: str) -> Any:
    """The click command of ``name``, built the way ``app.command()`` / ``app.add_typer`` build it."""
    module, attr, _ = COMMANDS[name]
    target = getattr(importlib.import_module(module), attr)
    outer = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    outer.callback()(_no_options)  # a group, so a sub-Typer with one command stays a group
    if isinstance(target, typer.Typer):
        outer.add_typer(target, name=name)
    else:
        outer.command(name)(target)
    return typer.main.get_command(outer).commands[name]


def _no_options() -> None:
    """Stands in for the root group while one command is built."""


class _LazyCommands(MutableMapping[str, Any]):
    """The root group's commands: every name is known up front, a command is built on first use.

    While the root help is drawn (``listing``) a name answers a stand-in that carries only its
    one-line help, so `powerfleet --help` lists every command and imports none of them."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}
        self.listing = False

    def __getitem__(self, name: str) -> Any:
        if name not in COMMANDS:
            return self._loaded[name]
        if name not in self._loaded:
            if self.listing:
                return typer.core.TyperCommand(name=name, help=COMMANDS[name][2])
            self._loaded[name] = load_command(name)
        return self._loaded[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        self._loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (n for n in self._loaded if n not in COMMANDS)

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._loaded))


class LazyGroup(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lazy = _LazyCommands()
        for name, cmd in dict(self.commands).items():
            lazy[name] = cmd
        self.commands = lazy

    def format_help(self, ctx: Any, formatter: Any) -> None:
        commands = self.commands
        assert isinstance(commands, _LazyCommands)
        commands.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            commands.listing = False


app = typer.Typer(
    cls=LazyGroup,
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
    from powerfleet.cli.context import CliState  # here: it imports the config model

    ctx.obj = CliState(config_path=config)


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
    except KeyboardInterrupt:  # Ctrl-C at any wait (a result, a FIFO, a drain's answer): one line
        typer.echo("powerfleet: interrupted", err=True)
        sys.exit(130)
    # The last line of defence for two families no option type catches everywhere: input nested
    # deeper than Python's parsers recurse, and a number too large for what it feeds (a float
    # of 1e308 seconds given to a socket timeout). Each stays one line.
    except RecursionError:
        typer.echo("powerfleet: error: input nested too deeply to parse", err=True)
        sys.exit(2)
    except OverflowError as exc:
        typer.echo(f"powerfleet: error: a number is out of range ({' '.join(str(exc).split())})", err=True)
        sys.exit(2)
    if code == 130:  # typer's answer to a KeyboardInterrupt inside a command: Exit(130), silently
        typer.echo("powerfleet: interrupted", err=True)
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
