"""`powerfleet worker | beat | flower`: one Celery process each, in the foreground (`agent`: cli/agent_cmd.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
from typing import Optional

import typer

from powerfleet.cli.context import export_config_path, fleet_app, fleet_config
from powerfleet.cli.errors import fail
from powerfleet.cli.ports import require_free_port
from powerfleet.config import FleetConfig, FlowerConfig
from powerfleet.queues import is_fleet_queue, worker_prefetch


METRICS_PORT_HELP = "Serve /metrics on this port (overrides metrics.port; 0 disables)."
LOGLEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "FATAL")
LOGLEVEL_HELP = "Log level: " + ", ".join(LOGLEVELS[:-1]) + " (any case)."


def check_loglevel(value: str) -> str:
    """A typer callback (also for `agent --loglevel`): Celery's own answer to a bad level is a usage box."""
    level = value.upper()
    if level not in LOGLEVELS:
        fail(f"--loglevel: {value!r} is not a log level ({', '.join(LOGLEVELS[:-1])})")
    return level


def _metrics_port(config: FleetConfig, override: Optional[int]) -> int:
    port = config.metrics.port if override is None else override
    if port:
        require_free_port(config.metrics.address, port, "--metrics-port" if override is not None else "metrics.port")
    return port


def _prepare_metrics(port: int, forks: bool) -> None:
    # Must run before prometheus_client is first imported (see powerfleet.metrics).
    if port and forks and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        path = tempfile.mkdtemp(prefix="powerfleet-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        # Prefork children leave with os._exit, so only this (the parent) removes it.
        atexit.register(shutil.rmtree, path, ignore_errors=True)


def _run_worker(ctx: typer.Context, queues: str, name: str, concurrency: int, loglevel: str,
                metrics_port: Optional[int] = None) -> None:
    config = fleet_config(ctx)
    export_config_path(ctx)
    port = _metrics_port(config, metrics_port)
    _prepare_metrics(port, forks=True)
    app = fleet_app(config)
    from powerfleet.metrics.registry import serve_metrics
    from powerfleet.metrics.signals import install_outcome_metrics

    from powerfleet.workers.logging import install_broker_retry_filter

    install_outcome_metrics()
    install_broker_retry_filter()
    serve_metrics(port, config.metrics.address)
    prefetch = worker_prefetch(queues.split(","), config.prefetch_multiplier)
    app.worker_main(["worker", "-Q", queues, "--prefetch-multiplier", str(prefetch), "-n", name, "-c", str(concurrency), "-P", "prefork",
                     "--loglevel", loglevel, "--without-mingle", "--without-gossip"])


def worker(
    ctx: typer.Context,
    queues: str = typer.Option("control,sweep", "--queues", "-Q", help="Comma-separated queues to consume."),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Worker node name (default fleet@<host>)."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, max=256, help="Prefork processes."),
    loglevel: str = typer.Option("INFO", "--loglevel", "-l", help=LOGLEVEL_HELP, callback=check_loglevel),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help=METRICS_PORT_HELP),
) -> None:
    """Run a worker consuming the given queues (control, sweep, node.<name>)."""
    qs = [q.strip() for q in queues.split(",") if q.strip()]
    if not qs:
        fail("--queues: give at least one queue name")
    bad = [q for q in qs if not is_fleet_queue(q)]
    if bad:
        fail(f"--queues: {bad[0]!r} is not a fleet queue (control, sweep or node.<node name>)")
    _run_worker(ctx, ",".join(qs), name or f"fleet@{socket.gethostname()}", concurrency, loglevel, metrics_port)


def beat(
    ctx: typer.Context,
    loglevel: str = typer.Option("INFO", "--loglevel", "-l", help=LOGLEVEL_HELP, callback=check_loglevel),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help=METRICS_PORT_HELP),
) -> None:
    """Run beat. A Redis lock (RedBeat) keeps a second beat on standby until the first stops."""
    config = fleet_config(ctx)
    export_config_path(ctx)
    port = _metrics_port(config, metrics_port)
    app = fleet_app(config)
    from powerfleet.metrics.registry import serve_metrics
    from powerfleet.metrics.signals import install_tick_metrics
    from powerfleet.queues import TICK_FAMILIES

    install_tick_metrics(TICK_FAMILIES)
    if port:
        from prometheus_client import REGISTRY

        from powerfleet.metrics.queues import QueueDepthCollector

        REGISTRY.register(QueueDepthCollector(app.broker_url_resolved, config.broker))
    serve_metrics(port, config.metrics.address)
    app.start(["beat", "--loglevel", loglevel, "--scheduler", "powerfleet.beat.scheduler:FleetScheduler"])


def flower(
    ctx: typer.Context,
    address: Optional[str] = typer.Option(None, "--address", help="Bind address (default from config: 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default from config: 5555)."),
) -> None:
    """Run Flower. Off loopback it refuses to start without basic-auth credentials.

    Credentials come from flower.basic_auth in the config or POWERFLEET_FLOWER__BASIC_AUTH,
    never from the command line (where `ps` would show them).
    """
    config = fleet_config(ctx)
    export_config_path(ctx)
    if port is not None and not 1 <= port <= 65535:
        fail(f"--port: {port} is not a port (1-65535)")
    fc = FlowerConfig(address=address or config.flower.address, port=port or config.flower.port,
                      basic_auth=config.flower.basic_auth)
    require_free_port(fc.address, fc.port, "--port" if port is not None else "flower.port")
    fleet_app(config)  # validates the broker before Flower's own retry loop hides the problem
    argv = ["-A", "powerfleet.workers.entry", "flower", f"--address={fc.address}", f"--port={fc.port}"]
    os.environ.update(flower_environment(fc))
    from powerfleet.cli.flower_api import TASKS_COLUMNS

    os.environ.setdefault("FLOWER_TASKS_COLUMNS", TASKS_COLUMNS)  # the list shows each result's summary
    from celery.bin.celery import celery as celery_cli

    from powerfleet.cli.flower_api import install_task_api_checks
    from powerfleet.cli.flower_queues import install_queue_consumers

    install_task_api_checks(allow_worker_control=config.flower.allow_worker_control)
    install_queue_consumers()  # the Broker page's Consumers column: which worker consumes each queue

    celery_cli.main(args=argv, prog_name="powerfleet flower")


def flower_environment(fc: FlowerConfig) -> dict[str, str]:
    """Flower's settings as FLOWER_* variables (credentials stay out of argv)."""
    if fc.basic_auth:
        return {"FLOWER_BASIC_AUTH": ",".join(fc.basic_auth)}
    if not fc.is_loopback:
        fail(f"flower: refusing to bind {fc.address} without basic auth; set flower.basic_auth "
             "(or POWERFLEET_FLOWER__BASIC_AUTH='[user:password]') or bind 127.0.0.1")
    # Loopback only: the task API is reachable from this machine alone.
    return {"FLOWER_UNAUTHENTICATED_API": "true"}
