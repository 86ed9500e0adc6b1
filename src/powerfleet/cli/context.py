"""What every command needs: the config (exit 2 on a bad one) and an app on a reachable broker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from powerfleet.cli.errors import EXIT_FAILURE, EXIT_USAGE, fail
from powerfleet.config import BrokerConfig, ConfigError, FleetConfig, load_config
from powerfleet.config.broker_urls import is_sentinel, redact  # redact: up prints the URL too

if TYPE_CHECKING:
    from powerfleet.workers.app import FleetCelery


@dataclass
class CliState:
    config_path: str | None = None


def fleet_config(ctx: typer.Context) -> FleetConfig:
    state: CliState = ctx.find_root().obj or CliState()
    try:
        return load_config(state.config_path)
    except ConfigError as exc:
        fail(f"config: {exc}")


def require_broker(config: FleetConfig) -> str:
    url = config.broker.url
    if url is None:
        fail("no broker configured: set broker.url (or POWERFLEET_BROKER__URL), "
             "or run `powerfleet up` to start one with an embedded Redis")
    return url


def check_broker_reachable(url: str, timeout_s: float = 3.0, broker: BrokerConfig | None = None) -> None:
    import redis

    from powerfleet.broker.clients import redis_client

    broker = broker or BrokerConfig()
    _check_sentinels(url, broker, timeout_s)
    client = redis_client(url, broker, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        reason = str(exc).split("\n")[0]
        fail(f"broker unreachable at {redact(url)}: {reason}", EXIT_FAILURE)
    except redis.ResponseError as exc:
        fail(f"broker at {redact(url)} refused the connection: {exc}", EXIT_FAILURE)
    except redis.RedisError as exc:  # InvalidResponse: something answers there, not Redis
        reason = " ".join(str(exc).split())[:200]
        fail(f"broker at {redact(url)} does not answer as Redis ({type(exc).__name__}: {reason})", EXIT_FAILURE)
    finally:
        client.close()


def _check_sentinels(url: str, broker: BrokerConfig, timeout_s: float) -> None:
    """With Sentinel URLs: a master name no Sentinel knows is a config error (exit 2)."""
    if not is_sentinel(url):
        return
    from powerfleet.broker.clients import BrokerConfigError, UnknownMaster
    from powerfleet.broker.topology import find_master

    try:
        find_master(url, broker, timeout_s)
    except BrokerConfigError as exc:
        fail(f"broker {redact(url)}: {exc}", EXIT_USAGE if isinstance(exc, UnknownMaster) else EXIT_FAILURE)


def fleet_app(config: FleetConfig, check: bool = True, with_tasks: bool = True) -> "FleetCelery":
    url = require_broker(config)
    if check:
        check_broker_reachable(url, broker=config.broker)
    from powerfleet.workers.app import create_app

    return create_app(config, url, with_tasks=with_tasks)


def export_config_path(ctx: typer.Context) -> None:
    """Child processes (celery's own CLI, Flower) read the same file through POWERFLEET_CONFIG."""
    state: CliState = ctx.find_root().obj or CliState()
    if state.config_path:
        os.environ["POWERFLEET_CONFIG"] = os.path.abspath(state.config_path)
